// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * dbcage tasks: a task iterator that writes one record per user-space process of the host
 * (thread group leaders; kernel threads are left out): its pid and its comm, the kernel's
 * 16-byte name. A scan of tens of thousands of processes reads every name with a few read()
 * calls on the iterator instead of an open, a read and a close of /proc/PID/comm each
 * (src/inventory/tasks.rs loads it).
 *
 * The iterator walks tasks in pid order, so the records come sorted. The pids are those of the
 * initial pid namespace (task->tgid); the first record is a header that holds the reading
 * process's own pid there, so that a reader in a pid namespace of its own (whose /proc numbers
 * differ) can tell and not use them.
 */
#include "kernel_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PF_KTHREAD 0x00200000 /* include/linux/sched.h; stable since 2.6 */
#define TASK_COMM_LEN 16

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct task_struct {
	unsigned int flags;
	int pid;
	int tgid;
	char comm[TASK_COMM_LEN];
};

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
};

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
};

#pragma clang attribute pop

/* What user space reads: 20 bytes a process, little-endian as the host. */
struct record {
	u32 pid;
	char comm[TASK_COMM_LEN];
};

/* Set once the header is written (one run of the iterator per load). */
u32 header_written = 0;

SEC("iter/task")
int dbcage_tasks(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct record r = {};

	if (!header_written) {
		header_written = 1;
		r.pid = bpf_get_current_pid_tgid() >> 32;
		bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	}
	if (!task)
		return 0; /* the end of the walk */
	if (BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0; /* a thread: its process has a record of its own */
	if (BPF_CORE_READ(task, flags) & PF_KTHREAD)
		return 0;
	r.pid = BPF_CORE_READ(task, tgid);
	bpf_core_read(&r.comm, sizeof(r.comm), &task->comm);
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
