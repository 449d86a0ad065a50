// Planted results for the check of the test runner's counting (tests/cli/runner.sh,
// tools/gtest_groups.bash): one test of each outcome, a crash between them and a hang. Disabled,
// so no ordinary run runs them; the check runs them with --gtest_also_run_disabled_tests. The
// order of definition is the order of the run: the crash comes after a pass, a failure and a
// skip, and one more pass follows it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

TEST(RunnerPlanted, DISABLED_Passes) { SUCCEED(); }
TEST(RunnerPlanted, DISABLED_Fails) { EXPECT_EQ(1 + 1, 3) << "planted failure"; }
TEST(RunnerPlanted, DISABLED_Skips) { GTEST_SKIP() << "planted skip"; }
TEST(RunnerPlanted, DISABLED_Crashes) { std::abort(); }
TEST(RunnerPlanted, DISABLED_PassesAfterTheCrash) { SUCCEED(); }

TEST(RunnerPlantedHang, DISABLED_Hangs) { std::this_thread::sleep_for(std::chrono::hours(1)); }
