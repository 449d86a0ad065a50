// llmpi-demo-corpus: writes a deterministic, seeded synthetic corpus of short English-like
// stories (plain ASCII), used as the demo data set for `make run`.
//
//   llmpi-demo-corpus --out FILE [--seed N] [--megabytes M] [--overwrite]
//
// Stories come from a small grammar: named characters with consistent pronouns, places,
// objects, weather, feelings, dialogue lines and cause/effect sentences, arranged by a
// dozen templates. Within a story the same names, objects and numbers recur, so a small
// byte-level model can learn both local spelling and some longer-range structure.
// Documents are separated by exactly one blank line (how llmpi-prep splits plain text);
// a story never contains a blank line. The file ends with a single newline.
//
// Determinism: every choice comes from an in-file xoshiro256** generator seeded by
// splitmix64, reduced to a range with integer arithmetic only, so the output for a given
// seed is byte-identical on any machine and with any compiler or standard library.
// Rule for editing the templates: at most ONE random draw per full expression. The operands
// of `a + b + c` (and function arguments) are evaluated in an unspecified order, so two draws
// in one expression come out in a different order under GCC and Clang; draw into a named
// local first.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace {

// ---- PRNG --------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& w : s_) w = splitmix64(x);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform integer in [0, n), n > 0; rejection sampling keeps it exactly uniform.
  uint32_t below(uint32_t n) {
    const uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
    uint64_t r;
    do r = next(); while (r >= limit);
    return static_cast<uint32_t>(r % n);
  }
  int range(int lo, int hi) { return lo + static_cast<int>(below(static_cast<uint32_t>(hi - lo + 1))); }
  bool chance(uint32_t num, uint32_t den) { return below(den) < num; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[below(static_cast<uint32_t>(v.size()))]; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// ---- vocabulary --------------------------------------------------------------------------------

using Words = std::vector<std::string>;

const Words kGirlNames = {"Anna", "Lily", "Mia",   "Sara", "Emma", "Nora", "Ella",  "Zoe",
                          "Ruth", "Maya", "Lucy",  "Grace", "Ivy", "Clara", "Rosa", "Hannah",
                          "Alice", "Julia", "Nina", "Tess"};
const Words kBoyNames = {"Tom",  "Ben",  "Sam",  "Leo",  "Max",  "Jack", "Noah", "Finn",
                         "Oscar", "Hugo", "Theo", "Eli", "Owen", "Paul", "Milo", "Adam",
                         "Peter", "Jonas", "Carl", "Dan"};
const Words kAnimalKinds = {"cat", "dog", "rabbit", "fox", "bird", "turtle", "mouse", "duck",
                            "frog", "owl", "horse", "lamb", "bear", "goat", "puppy", "kitten"};
const Words kPetNames = {"Pip", "Biscuit", "Shadow", "Button", "Pepper", "Sunny",
                         "Fluff", "Socks", "Coco",  "Bubbles", "Ginger", "Patch"};
const Words kRelatives = {"mom", "dad", "grandma", "grandpa", "aunt", "uncle", "big sister",
                          "big brother"};

struct Place {
  std::string name;  // "the park"
  std::string prep;  // "in"
};
const std::vector<Place> kPlaces = {
    {"the park", "in"},       {"the forest", "in"},   {"the beach", "at"},
    {"the market", "at"},     {"the garden", "in"},   {"the library", "in"},
    {"the river", "by"},      {"the farm", "on"},     {"the school", "at"},
    {"the hill", "on"},       {"the kitchen", "in"},  {"the old barn", "in"},
    {"the lake", "by"},       {"the meadow", "in"},   {"the town square", "in"},
    {"the bakery", "at"},     {"the zoo", "at"},      {"the playground", "at"},
    {"the station", "at"},    {"the big tree", "under"}};

const Words kObjects = {"ball", "kite", "hat", "book", "key", "boat", "scarf", "drum",
                        "box", "cup", "shoe", "bell", "map", "lamp", "doll", "coin",
                        "umbrella", "basket", "ribbon", "whistle", "sock", "pencil", "ring",
                        "jar"};
const Words kColors = {"red", "blue", "green", "yellow", "little", "old", "shiny", "new",
                       "orange", "purple", "tiny", "big", "white", "black", "striped"};
const Words kFoods = {"apples", "cookies", "oranges", "pears", "sandwiches", "cakes", "plums",
                      "carrots", "muffins", "cherries", "grapes", "buns"};
const Words kFood = {"apple", "cookie", "orange", "pear", "sandwich", "cake", "plum",
                     "carrot", "muffin", "cherry", "grape", "bun"};  // singulars of kFoods
const Words kHiding = {"under the bed", "behind the door", "in a box", "under a bush",
                       "in the grass", "on a high shelf", "next to a rock", "inside a boot",
                       "under a pile of leaves", "behind the sofa"};
const Words kGoodFeelings = {"happy", "glad", "proud", "excited", "calm", "thankful"};
const Words kBadFeelings = {"sad", "scared", "angry", "tired", "worried", "lonely", "upset"};
const Words kSkills = {"ride a bike", "swim", "whistle", "tie a knot", "climb a tree",
                       "bake bread", "read a long book", "play the flute", "skip a stone",
                       "draw a horse", "juggle three balls", "build a tower"};
const Words kTimes = {"One day", "One morning", "One Saturday", "One evening",
                      "Last summer", "After school", "Early one morning", "One afternoon",
                      "Yesterday", "On Sunday"};
const Words kOpenings = {"Once upon a time, there was", "There once was", "Long ago, there lived",
                         "In a small town, there lived", "Not far from here, there lived"};
const Words kTraits = {"kind", "curious", "brave", "shy", "funny", "clever", "busy", "quiet",
                       "cheerful", "careful", "little", "gentle"};
const Words kNumbers = {"zero", "one", "two",   "three", "four", "five",  "six",
                        "seven", "eight", "nine", "ten", "eleven", "twelve"};

struct Weather {
  std::string state;   // "it was raining"
  std::string effect;  // "took an umbrella"
  std::string why;     // "the rain"
};
const std::vector<Weather> kWeather = {
    {"it was raining", "took an umbrella", "the rain"},
    {"it was very cold", "put on a warm coat", "the cold"},
    {"it was windy", "held on to the hat", "the wind"},
    {"it was snowing", "wore big boots", "the snow"},
    {"it was hot and sunny", "drank a lot of water", "the sun"},
    {"it was foggy", "walked very slowly", "the fog"},
    {"the sky was dark", "carried a lamp", "the dark sky"}};

// ---- text helpers ------------------------------------------------------------------------------

std::string cap(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

bool vowel_start(const std::string& s) {
  return !s.empty() && std::strchr("aeiou", s[0]) != nullptr;
}
std::string a(const std::string& noun) { return (vowel_start(noun) ? "an " : "a ") + noun; }

struct Person {
  std::string name;
  bool female;
  std::string kind;  // "girl", "boy", "fox", ...
  std::string subj() const { return female ? "she" : "he"; }
  std::string obj() const { return female ? "her" : "him"; }
  std::string poss() const { return female ? "her" : "his"; }
};

class Story {
 public:
  explicit Story(Rng& r) : r_(r) {}

  // Appends a narrative sentence to the current paragraph line.
  void say(const std::string& sentence) {
    if (!para_.empty()) para_ += ' ';
    para_ += cap(sentence);
  }
  // A dialogue line on its own line: "Text," Name said.  /  Name said, "Text."
  void quote(const Person& who, std::string text, bool question = false) {
    flush();
    text = cap(text);
    static const Words said = {"said", "said", "said", "called", "whispered", "shouted",
                               "replied", "added"};
    std::string verb = question ? "asked" : r_.pick(said);
    std::string line;
    switch (r_.below(3)) {
      case 0:
        line = "\"" + text + (question ? "?\" " : ",\" ") + who.name + " " + verb + ".";
        break;
      case 1:
        line = cap(who.name) + " " + verb + ", \"" + text + (question ? "?\"" : ".\"");
        break;
      default:
        line = "\"" + text + (question ? "?\" " : ",\" ") + verb + " " + who.name + ".";
        break;
    }
    lines_.push_back(line);
  }
  void flush() {
    if (!para_.empty()) lines_.push_back(para_);
    para_.clear();
  }
  std::string finish() {
    flush();
    std::string out;
    for (const auto& l : lines_) {
      out += l;
      out += '\n';
    }
    return out;
  }

 private:
  Rng& r_;
  std::vector<std::string> lines_;
  std::string para_;
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : r_(seed) {}

  std::string story() {
    Story s(r_);
    switch (r_.below(12)) {
      case 0: lost_object(s); break;
      case 1: trip(s); break;
      case 2: sharing(s); break;
      case 3: cheer_up(s); break;
      case 4: counting(s); break;
      case 5: learn_skill(s); break;
      case 6: found_animal(s); break;
      case 7: baking(s); break;
      case 8: weather_day(s); break;
      case 9: market(s); break;
      case 10: riddle(s); break;
      default: hide_and_seek(s); break;
    }
    return s.finish();
  }

 private:
  Person child() {
    Person p;
    p.female = r_.chance(1, 2);
    p.name = r_.pick(p.female ? kGirlNames : kBoyNames);
    p.kind = p.female ? "girl" : "boy";
    return p;
  }
  Person other_child(const Person& not_this) {
    for (;;) {
      Person p = child();
      if (p.name != not_this.name) return p;
    }
  }
  Person animal() {
    Person p;
    p.female = r_.chance(1, 2);
    p.name = r_.pick(kPetNames);
    p.kind = r_.pick(kAnimalKinds);
    return p;
  }
  std::string thing() {
    if (!r_.chance(2, 3)) return r_.pick(kObjects);
    std::string color = r_.pick(kColors);
    return color + " " + r_.pick(kObjects);
  }
  const Place& place() { return r_.pick(kPlaces); }
  std::string at(const Place& p) { return std::string(p.prep) + " " + p.name; }
  std::string num(int n) { return (n >= 0 && n < static_cast<int>(kNumbers.size())) ? kNumbers[n] : std::to_string(n); }
  // "no apples", "one apple", "three apples".
  std::string amount(int n, const std::string& one, const std::string& many) {
    if (n == 0) return "no " + many;
    return num(n) + " " + (n == 1 ? one : many);
  }

  void intro(Story& s, const Person& p) {
    if (r_.chance(1, 2)) {
      std::string opening = r_.pick(kOpenings);
      s.say(opening + " " + a(r_.pick(kTraits) + " " + p.kind) + " named " + p.name + ".");
    } else {
      s.say(p.name + " was " + a(r_.pick(kTraits) + " " + p.kind) + ".");
    }
  }
  void ending(Story& s, const Person& p, const std::string& lesson) {
    switch (r_.below(4)) {
      case 0: s.say("From that day on, " + p.name + " always " + lesson + "."); break;
      case 1: s.say("The end."); break;
      case 2: s.say("That night, " + p.name + " went to bed feeling " + r_.pick(kGoodFeelings) + "."); break;
      default: s.say(p.name + " smiled. It had been a good day."); break;
    }
  }

  // ---- templates -------------------------------------------------------------------------------

  void lost_object(Story& s) {
    Person p = child();
    Person f = other_child(p);
    std::string obj = thing();
    const Place& pl = place();
    intro(s, p);
    s.say(p.name + " had " + a(obj) + ". " + cap(p.subj()) + " loved it very much.");
    s.say(r_.pick(kTimes) + ", " + p.name + " went to play " + at(pl) + ".");
    s.say("When " + p.subj() + " came home, the " + obj + " was gone!");
    s.say(p.name + " felt " + r_.pick(kBadFeelings) + ".");
    s.quote(p, "where is my " + obj, true);
    s.say(p.name + " asked " + p.poss() + " friend " + f.name + " for help.");
    s.quote(f, "let us look " + at(pl), false);
    std::string spot = r_.pick(kHiding);
    s.say("They looked everywhere. At last, " + f.name + " found the " + obj + " " + spot + ".");
    s.quote(p, "thank you, " + f.name, false);
    s.say(p.name + " was so " + r_.pick(kGoodFeelings) + " that " + p.subj() + " hugged " + f.name + ".");
    ending(s, p, "kept " + p.poss() + " " + obj + " in a safe place");
  }

  void trip(Story& s) {
    Person p = child();
    std::string rel = r_.pick(kRelatives);
    const Place& pl = place();
    const Weather& w = r_.pick(kWeather);
    intro(s, p);
    s.say(r_.pick(kTimes) + ", " + p.name + " and " + p.poss() + " " + rel + " wanted to go to " + pl.name + ".");
    if (r_.chance(1, 2)) {
      s.say("Because " + std::string(w.state) + ", " + p.name + " " + w.effect + ".");
    } else {
      s.say(cap(w.state) + ", so " + p.name + " " + w.effect + ".");
    }
    s.quote(p, "are we there yet", true);
    s.quote(Person{"the " + rel, false, ""}, "not yet. Be patient", false);
    std::string seen = r_.pick(kAnimalKinds);
    s.say("On the way, they saw " + a(seen) + ". The " + seen + " looked at " + p.name + " and ran away.");
    s.say("When they got to " + pl.name + ", " + p.name + " was " + r_.pick(kGoodFeelings) + ".");
    if (r_.chance(1, 2)) {
      std::string food = r_.pick(kFoods);
      s.say("They sat down " + at(pl) + " and ate " + food + ".");
      s.quote(p, "these " + food + " are the best", false);
    }
    s.say("After a long day, they walked home together.");
    ending(s, p, "remembered the trip to " + std::string(pl.name));
  }

  void sharing(Story& s) {
    Person p = child();
    Person q = other_child(p);
    std::string obj = thing();
    intro(s, p);
    s.say(p.name + " and " + q.name + " were playing " + at(place()) + ".");
    s.say("They both wanted to play with the same " + obj + ".");
    s.quote(p, "it is mine", false);
    s.quote(q, "no, it is mine", false);
    s.say("They pulled and pulled, and both of them felt " + r_.pick(kBadFeelings) + ".");
    if (r_.chance(1, 2)) {
      std::string rel = r_.pick(kRelatives);
      s.say(cap(p.poss()) + " " + rel + " saw them and came over.");
      s.quote(Person{"the " + rel, false, ""}, "why not take turns", true);
    } else {
      s.say("Then " + p.name + " had an idea.");
      s.quote(p, "let us take turns", false);
    }
    int n = r_.range(2, 10);
    s.say("So " + p.name + " played with the " + obj + " for " + num(n) + " minutes, and then " + q.name +
          " played with it for " + num(n) + " minutes.");
    s.say("Sharing was more fun than fighting.");
    ending(s, p, "shared " + p.poss() + " toys with " + q.name);
  }

  void cheer_up(Story& s) {
    Person p = child();
    Person q = other_child(p);
    static const Words reasons = {"it was raining and " + std::string("the picnic was over"),
                                  "nobody wanted to play",
                                  "the tower fell down",
                                  "the ice cream fell on the ground",
                                  "the kite was stuck in a tree",
                                  "the cake was burned"};
    std::string reason = r_.pick(reasons);
    std::string bad = r_.pick(kBadFeelings);
    intro(s, p);
    std::string when = r_.pick(kTimes);
    s.say(when + ", " + p.name + " saw " + q.name + " sitting alone " + at(place()) + ".");
    s.say(q.name + " looked " + bad + ".");
    s.quote(p, "why are you " + bad, true);
    s.quote(q, "because " + reason, false);
    switch (r_.below(3)) {
      case 0: {
        std::string food = r_.pick(kFoods);
        s.say(p.name + " gave " + q.name + " some " + food + ".");
        break;
      }
      case 1: s.say(p.name + " told " + q.name + " a funny story about " + a(r_.pick(kAnimalKinds)) + "."); break;
      default: s.say(p.name + " asked " + q.name + " to play with " + p.obj() + "."); break;
    }
    s.say("Soon " + q.name + " was smiling again.");
    s.quote(q, "you are a good friend, " + p.name, false);
    ending(s, p, "helped friends who were " + bad);
  }

  void counting(Story& s) {
    Person p = child();
    Person q = other_child(p);
    const uint32_t fi = r_.below(static_cast<uint32_t>(kFoods.size()));
    const std::string& food = kFoods[fi];
    const std::string& one = kFood[fi];
    int have = r_.range(3, 12);
    int give = r_.range(1, have - 1);
    intro(s, p);
    s.say(p.name + " had " + num(have) + " " + food + " in a basket.");
    s.say(q.name + " had no " + food + ".");
    s.quote(q, "can I have some " + food, true);
    s.quote(p, "yes, you can have " + num(give), false);
    s.say(p.name + " gave " + amount(give, one, food) + " to " + q.name + ".");
    int left = have - give;
    s.say("Now " + p.name + " had " + amount(left, one, food) + " and " + q.name + " had " + num(give) + ".");
    if (r_.chance(1, 2)) {
      int ate = r_.range(1, left);
      s.say(p.name + " ate " + num(ate) + (ate == 1 ? " " + one : " of them") + ", so " + p.subj() + " had " +
            (left == ate ? std::string("none") : num(left - ate)) + " left.");
    }
    s.say(p.name + " and " + q.name + " were both " + r_.pick(kGoodFeelings) + ".");
    ending(s, p, "shared " + p.poss() + " " + food);
  }

  void learn_skill(Story& s) {
    Person p = child();
    std::string skill = r_.pick(kSkills);
    std::string rel = r_.pick(kRelatives);
    intro(s, p);
    s.say(p.name + " wanted to learn to " + skill + ".");
    s.say("The first time " + p.subj() + " tried, " + p.subj() + " could not do it.");
    s.say(p.name + " felt " + r_.pick(kBadFeelings) + ".");
    s.quote(p, "I will never learn to " + skill, false);
    s.say(cap(p.poss()) + " " + rel + " sat down next to " + p.obj() + ".");
    s.quote(Person{"the " + rel, false, ""}, "try again. Every day, a little more", false);
    int days = r_.range(2, 10);
    s.say("So " + p.name + " practiced every day for " + num(days) + " days.");
    s.say("On the last day, " + p.name + " could " + skill + "!");
    s.quote(p, "look, I can " + skill, false);
    ending(s, p, "kept trying when something was hard");
  }

  void found_animal(Story& s) {
    Person p = child();
    Person pet = animal();
    const Place& pl = place();
    intro(s, p);
    s.say(r_.pick(kTimes) + ", " + p.name + " found a small " + pet.kind + " " + at(pl) + ".");
    s.say("The " + pet.kind + " was " + r_.pick(kBadFeelings) + " and hungry.");
    s.quote(p, "do not be afraid, little " + pet.kind, false);
    s.say(p.name + " took the " + pet.kind + " home and gave " + pet.obj() + " some water.");
    s.say(p.name + " named " + pet.obj() + " " + pet.name + ".");
    s.say("Every day, " + p.name + " and " + pet.name + " played " + at(place()) + ".");
    if (r_.chance(1, 2)) {
      s.say("One night, " + pet.name + " ran away, and " + p.name + " looked for " + pet.obj() + " everywhere.");
      s.say("At last " + p.subj() + " found " + pet.name + " " + r_.pick(kHiding) + ".");
    }
    s.say(pet.name + " was not " + r_.pick(kBadFeelings) + " anymore.");
    ending(s, p, "took good care of " + pet.name);
  }

  void baking(Story& s) {
    Person p = child();
    std::string rel = r_.pick(kRelatives);
    static const Words dishes = {"a cake", "bread", "cookies", "a pie", "buns", "a fruit tart", "muffins"};
    static const Words steps = {"put flour in a bowl", "added two eggs", "poured in some milk",
                                "added a spoon of sugar", "stirred it all together", "added some butter",
                                "cut the fruit into pieces", "added a pinch of salt"};
    std::string dish = r_.pick(dishes);
    intro(s, p);
    s.say(r_.pick(kTimes) + ", " + p.name + " and " + p.poss() + " " + rel + " wanted to make " + dish + ".");
    const uint32_t n = static_cast<uint32_t>(steps.size());
    const uint32_t i = r_.below(n);
    const uint32_t j = (i + 1 + r_.below(n - 1)) % n;  // j != i
    uint32_t k = r_.below(n);
    while (k == i || k == j) k = (k + 1) % n;  // k differs from both
    s.say("First, they " + steps[i] + ".");
    s.say("Then they " + steps[j] + ".");
    s.say("Next, they " + steps[k] + ".");
    int mins = r_.range(2, 6) * 10;
    s.say("Finally, they put it in the oven for " + std::to_string(mins) + " minutes.");
    s.quote(p, "it smells so good", false);
    if (r_.chance(1, 3)) {
      s.say("But they forgot about it, and it was burned!");
      s.say("So they made it again, and this time they watched the clock.");
    }
    s.say("They ate it together, and it was delicious.");
    ending(s, p, "helped in the kitchen");
  }

  void weather_day(Story& s) {
    Person p = child();
    const Weather& w = r_.pick(kWeather);
    const Place& pl = place();
    intro(s, p);
    s.say(r_.pick(kTimes) + ", " + p.name + " looked out of the window. " + cap(w.state) + ".");
    s.say("Because of " + std::string(w.why) + ", " + p.name + " " + w.effect + ".");
    s.say("Then " + p.subj() + " went to " + pl.name + ".");
    if (r_.chance(1, 2)) {
      Person q = other_child(p);
      s.say(cap(at(pl)) + ", " + p.subj() + " met " + q.name + ".");
      s.quote(q, "hello, " + p.name + ". Do you want to play", true);
      s.quote(p, "yes, I do", false);
      s.say("They played together until it was time to go home.");
    } else {
      s.say(p.name + " played alone, but " + p.subj() + " was " + r_.pick(kGoodFeelings) + ".");
    }
    ending(s, p, "looked at the sky before going out");
  }

  void market(Story& s) {
    Person p = child();
    std::string rel = r_.pick(kRelatives);
    std::string food = r_.pick(kFoods);
    int coins = r_.range(3, 12);
    int price = r_.range(1, coins);
    intro(s, p);
    s.say(p.name + "'s " + rel + " gave " + p.obj() + " " + num(coins) + " coins.");
    s.say(p.name + " went to the market to buy " + food + ".");
    s.quote(p, "how much are the " + food, true);
    s.quote(Person{"the seller", false, ""}, "they are " + amount(price, "coin", "coins"), false);
    s.say(p.name + " paid " + amount(price, "coin", "coins") + ". Now " + p.subj() + " had " +
          amount(coins - price, "coin", "coins") + " left.");
    if (coins - price > 0 && r_.chance(1, 2)) {
      s.say("With the coins that were left, " + p.subj() + " bought " + a(thing()) + " for " + p.poss() + " " + rel + ".");
      s.quote(Person{"the " + rel, false, ""}, "what a nice gift", false);
    }
    static const Words moods = {"happy", "glad", "excited", "calm", "thankful"};
    s.say(p.name + " walked home with the " + food + ", " + r_.pick(moods) + " and proud.");
    ending(s, p, "counted " + p.poss() + " coins carefully");
  }

  void riddle(Story& s) {
    Person p = child();
    Person q = other_child(p);
    struct Riddle {
      const char* question;
      const char* answer;
    };
    static const std::vector<Riddle> riddles = {
        {"what has keys but can not open doors", "a piano"},
        {"what has hands but can not clap", "a clock"},
        {"what gets wet while it dries", "a towel"},
        {"what has a neck but no head", "a bottle"},
        {"what has many teeth but can not bite", "a comb"},
        {"what goes up but never comes down", "your age"},
        {"what has legs but can not walk", "a table"}};
    const Riddle& rd = r_.pick(riddles);
    intro(s, p);
    s.say(p.name + " liked riddles. " + r_.pick(kTimes) + ", " + p.subj() + " asked " + q.name + " a riddle.");
    s.quote(p, rd.question, true);
    s.say(q.name + " thought and thought.");
    if (r_.chance(1, 2)) {
      s.quote(q, std::string("is it ") + rd.answer, true);
      s.quote(p, std::string("yes! It is ") + rd.answer, false);
      s.say(q.name + " was " + r_.pick(kGoodFeelings) + ".");
    } else {
      s.quote(q, "I do not know", false);
      s.quote(p, std::string("the answer is ") + rd.answer, false);
      s.say(q.name + " laughed.");
    }
    ending(s, p, "had a new riddle for " + q.name);
  }

  void hide_and_seek(Story& s) {
    Person p = child();
    Person q = other_child(p);
    const Place& pl = place();
    int count = r_.range(5, 12);
    intro(s, p);
    s.say(p.name + " and " + q.name + " played hide and seek " + at(pl) + ".");
    s.say(p.name + " closed " + p.poss() + " eyes and counted to " + num(count) + ".");
    std::string counted;
    for (int i = 1; i <= count; ++i) counted += (i > 1 ? ", " : "") + num(i);
    s.quote(p, counted + "! Ready or not, here I come", false);
    std::string spot = r_.pick(kHiding);
    s.say(q.name + " was hiding " + spot + ".");
    std::string wrong = r_.pick(kHiding);
    while (wrong == spot) wrong = r_.pick(kHiding);
    s.say(p.name + " looked " + wrong + ", but " + q.name + " was not there.");
    s.say("Then " + p.name + " looked " + spot + " and found " + q.obj() + ".");
    s.quote(p, "I found you", false);
    s.quote(q, "now it is my turn to count", false);
    ending(s, p, "loved playing hide and seek with " + q.name);
  }

  Rng r_;
};

// ---- command line ------------------------------------------------------------------------------

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "llmpi-demo-corpus: error: %s\n(run llmpi-demo-corpus --help for usage)\n", msg.c_str());
  std::exit(1);
}

void print_help() {
  std::printf(
      "usage: llmpi-demo-corpus --out FILE [--seed N] [--megabytes M] [--overwrite]\n"
      "\n"
      "Writes a deterministic synthetic corpus of short English-like stories (plain ASCII),\n"
      "documents separated by one blank line, for llmpi-prep. Same seed => same bytes.\n"
      "\n"
      "  --out FILE       output path (written to FILE.tmp, then renamed); an existing non-empty\n"
      "                   FILE is refused unless --overwrite is given\n"
      "  --seed N         seed, 0..18446744073709551615 (default 1234)\n"
      "  --megabytes M    approximate size in MB of 1,000,000 bytes, 0 < M <= 100000 (default 4);\n"
      "                   generation stops after the first story that reaches the size\n"
      "  --overwrite      replace an existing FILE\n"
      "  -h, --help       show this help\n");
}

uint64_t parse_seed(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] < '0' || s[0] > '9' || errno != 0 || *end != '\0')
    usage_error("--seed must be a whole number in 0..18446744073709551615, got '" + s + "'");
  return static_cast<uint64_t>(v);
}

double parse_megabytes(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || *end != '\0' || !std::isfinite(v) || v <= 0.0 || v > 100000.0)
    usage_error("--megabytes must be a number with 0 < M <= 100000, got '" + s + "'");
  return v;
}

int run(int argc, char** argv) {
  std::string out;
  uint64_t seed = 1234;
  double megabytes = 4.0;
  bool overwrite = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string val;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        val = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&]() -> std::string {
      if (has_inline) return val;
      if (i + 1 >= argc) usage_error("option " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      print_help();
      return 0;
    } else if (arg == "--out") {
      out = value();
      if (out.empty()) usage_error("--out must not be empty");
    } else if (arg == "--seed") {
      seed = parse_seed(value());
    } else if (arg == "--megabytes") {
      megabytes = parse_megabytes(value());
    } else if (arg == "--overwrite") {
      if (has_inline) usage_error("--overwrite takes no value");
      overwrite = true;
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (out.empty()) usage_error("--out FILE is required");
  struct stat st;
  if (::stat(out.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) usage_error("--out '" + out + "' is a directory; give a file name");
    if (st.st_size > 0 && !overwrite)
      usage_error("--out '" + out + "' exists and is not empty; choose another name, or give --overwrite to replace it");
  }

  const uint64_t target = static_cast<uint64_t>(std::llround(megabytes * 1e6));
  const std::string tmp = out + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) llmpi::fail("cannot open '", tmp, "' for writing: ", std::strerror(errno), " (check that the directory exists and is writable)");

  Generator gen(seed);
  uint64_t bytes = 0, stories = 0;
  std::string buf;
  buf.reserve(1 << 20);
  bool ok = true;
  while (bytes < target) {
    if (stories > 0) buf += '\n';  // one blank line between documents
    buf += gen.story();
    ++stories;
    if (buf.size() >= (1u << 20) || bytes + buf.size() >= target) {
      ok = ok && std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
      bytes += buf.size();
      buf.clear();
    }
  }
  int saved = errno;
  ok = ok && std::fflush(f) == 0;
  if (!ok) saved = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    llmpi::fail("writing '", tmp, "' failed: ", std::strerror(saved));
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    saved = errno;
    std::remove(tmp.c_str());
    llmpi::fail("cannot rename '", tmp, "' to '", out, "': ", std::strerror(saved));
  }
  std::printf("llmpi-demo-corpus: wrote %llu stories, %llu bytes to %s (seed %llu)\n",
              static_cast<unsigned long long>(stories), static_cast<unsigned long long>(bytes), out.c_str(),
              static_cast<unsigned long long>(seed));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmpi-demo-corpus: error: %s\n", e.what());
    return 1;
  }
}
