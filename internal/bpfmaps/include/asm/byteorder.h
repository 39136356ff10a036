/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* npagent: asm/byteorder.h for the BPF target: the byte order clang compiles for.
 * See ../README.md. */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#include <linux/byteorder/big_endian.h>
#else
#include <linux/byteorder/little_endian.h>
#endif
