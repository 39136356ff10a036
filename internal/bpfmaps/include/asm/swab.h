/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* npagent: asm/swab.h for the BPF target: no architecture-specific byte swaps.
 * See ../README.md. */
#include <asm-generic/swab.h>
