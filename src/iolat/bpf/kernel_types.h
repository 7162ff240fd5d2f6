/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The few kernel types iolat.bpf.c reads, declared with only the fields it uses. Every struct
 * carries preserve_access_index, so clang emits a CO-RE relocation for each field access and
 * libbpf resolves the real offset against the running kernel's BTF (/sys/kernel/btf/vmlinux)
 * at load time: one object file serves every kernel with BTF, whatever its struct layouts.
 * This replaces a generated vmlinux.h (megabytes, tied to the build host's kernel).
 */
#ifndef DBCAGE_KERNEL_TYPES_H
#define DBCAGE_KERNEL_TYPES_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
};

enum {
	BPF_F_NO_PREALLOC = 1,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct kernfs_node {
	u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct cgroup_subsys_state {
	struct cgroup *cgroup;
};

struct blkcg {
	struct cgroup_subsys_state css;
};

struct blkcg_gq {
	struct blkcg *blkcg;
};

struct blk_mq_ops;

struct request_queue {
	const struct blk_mq_ops *mq_ops;
};

struct gendisk {
	int major;
	int first_minor;
	struct request_queue *queue;
};

struct block_device {
	struct gendisk *bd_disk;
};

struct bvec_iter {
	unsigned int bi_size;
};

struct bio {
	struct bio *bi_next;
	unsigned int bi_opf;
	struct block_device *bi_bdev;
	struct blkcg_gq *bi_blkg;
	struct bvec_iter bi_iter;
};

struct request {
	struct bio *bio;
	u64 start_time_ns;
};

#pragma clang attribute pop

#endif
