/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* npagent: asm/types.h for the BPF target (what every architecture's says).
 * See ../README.md. */
#include <asm-generic/types.h>
