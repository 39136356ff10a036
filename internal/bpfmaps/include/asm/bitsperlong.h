/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* npagent: asm/bitsperlong.h for the BPF target: long is 64 bits.
 * See ../README.md. */
#ifndef __BITS_PER_LONG
#define __BITS_PER_LONG 64
#endif
#include <asm-generic/bitsperlong.h>
