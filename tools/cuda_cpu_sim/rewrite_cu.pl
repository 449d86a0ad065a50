#!/usr/bin/perl
# A kernels/*.cu file as C++ that g++ compiles against cuda_shim.h / launch.h (README.md here):
#   kernel<<<grid, block[, smem[, stream]]>>>(args)  ->  ::llmpi::sim::launcher(kernel, grid, block, ...)(args)
#   extern __shared__ [__align__(n)] T name[];        ->  T* const name = ::llmpi::sim::dynamic_shared<T>();
#   __shared__ T a[N][M], b[K];                       ->  auto& a = ::llmpi::sim::static_shared<T[N][M]>([] {}); ...
# Everything else is left as it is. Usage: rewrite_cu.pl in.cu > out.cpp (exit 1 if a launch or
# shared declaration is left that it did not understand).
use strict;
use warnings;

local $/;
my $src = <>;

$src =~ s{extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+(?:\s+[\w:]+)*?)\s+(\w+)\s*\[\s*\]\s*;}
         {$1* const $2 = ::llmpi::sim::dynamic_shared<$1>();}g;

sub static_decls {
  my ($type, $decls) = @_;
  my @out;
  for my $d (split /,/, $decls) {
    $d =~ /^\s*(\w+)\s*((?:\[[^\]]+\])+)\s*$/ or die "rewrite_cu.pl: a __shared__ declaration it cannot read: $d\n";
    push @out, "auto& $1 = ::llmpi::sim::static_shared<$type$2>([] {});";
  }
  return join(' ', @out);
}
$src =~ s{\b__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+(?:\s+[\w:]+)*?)\s+(\w+\s*\[[^;]+);}{static_decls($1, $2)}ge;

$src =~ s{([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>}{::llmpi::sim::launcher($1, $2)}gs;

if ($src =~ /(<<<|>>>|__shared__)/) {
  print STDERR "rewrite_cu.pl: '$1' left in the rewrite\n";
  exit 1;
}
print $src;
