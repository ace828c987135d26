#!/usr/bin/perl
# cu2cc.pl: a CUDA source as C++ for the CPU emulator (tools/cuda-emu/emu.h):
#   k<<<grid, block[, smem[, stream]]>>>(args)  ->  toy_emu_launch(toy_emu_config(grid, block, ...), "k", [](auto... x_) { k(x_...); }, args)
#   extern __shared__ T name[];                 ->  T *name = (T *)toy_emu_smem;
# Line numbers are kept (a #line names the .cu), so diagnostics point at it.
# usage: cu2cc.pl in.cu > out.cc
use strict;
use warnings;
my $path = $ARGV[0] or die "usage: cu2cc.pl file.cu\n";
open(my $fh, '<', $path) or die "cu2cc.pl: $path: $!\n";
local $/;
my $src = <$fh>;
close $fh;
my $launches = ($src =~ s{\b([A-Za-z_]\w*(?:<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\((\s*\))?}
    { "toy_emu_launch(toy_emu_config($2), \"$1\", [](auto... x_) { $1(x_...); }" . (defined $3 ? ")" : ", ") }gse);
$src =~ s{\bextern\s+__shared__\s+([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;}{$1 *$2 = ($1 *)toy_emu_smem;}g;
die "cu2cc.pl: $path: a launch left unrewritten\n" if $src =~ /<<</;
print "#line 1 \"$path\"\n", $src;
