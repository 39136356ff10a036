/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* npagent: asm/posix_types.h for the BPF target: the generic types.
 * See ../README.md. */
#include <asm-generic/posix_types.h>
