// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * dbcage iolat: per cgroup, per disk and per operation, log2 histograms of how long each bio
 * took from submission to completion, split into the wait before the block layer queued it
 * (blk-throttle holds throttled bios there) and the service after it.
 *
 * Attribution is the bio's own blkcg (bio->bi_blkg->blkcg), the group the block layer charges
 * and throttles, not the task that happens to run at submission or completion: the kernel
 * sets it for writeback from the page owner's group (v2) and for the submitter otherwise.
 *
 *   fentry/__blk_throtl_bio    a bio entering blk-throttle: only bios of groups with a limit on
 *                              their disk come here, so the others pay no map update (the
 *                              loader falls back to submit_bio_noacct, every bio, on kernels
 *                              without that function)
 *   tp_btf/block_bio_queue     the bio passed the throttle and is being queued
 *   tp_btf/block_rq_complete   a request completed: its bios are done (blk-mq devices)
 *   tp_btf/block_bio_complete  a bio completed on a bio-based device (dm, md); blk-mq clears
 *                              the flag that fires it, as block_rq_complete traces its bios
 *
 * The block layer has no tracepoint before blk-throttle, so the throttle's wait needs the
 * fentry hook, which some kernels refuse (no ftrace direct calls, or an LSM policy). The
 * loader then loads the two tracepoints alone: latency counts from the queue, and the
 * `queued` histograms stay empty.
 */
#include "kernel_types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Slot k holds [2^k, 2^(k+1)) us; slot 0 also holds < 1 us, the last slot everything above.
 * Each slot is cut into SUB equal parts, so that a percentile is known to 1/16 of its value
 * (HDR histograms do the same with their sub-buckets); the text view folds them again.
 */
#define SLOTS 24
#define SUB_BITS 3
#define SUB (1 << SUB_BITS)

/* Values of `enum iolat_op`, mirrored in src/iolat/mod.rs. */
#define OP_READ 0
#define OP_WRITE 1
#define OP_FLUSH 2
#define OP_DISCARD 3

/* enum req_op (include/linux/blk_types.h); stable since 4.10. */
#define REQ_OP_READ 0
#define REQ_OP_WRITE 1
#define REQ_OP_FLUSH 2
#define REQ_OP_DISCARD 3
#define REQ_OP_SECURE_ERASE 5
#define REQ_OP_WRITE_ZEROES 9
#define REQ_OP_MASK 0xff

struct hist {
	u64 fine[SLOTS * SUB];
	u64 slot_ns[SLOTS];
	u64 count;
	u64 sum_ns;
};

struct hist_key {
	u64 cgroup_id;
	u32 dev; /* major << 20 | minor of the whole disk */
	u32 op;
};

/* total = submit -> complete; queued = submit -> queued (throttle); service = queued -> complete */
struct hist_val {
	struct hist total;
	struct hist queued;
	struct hist service;
};

struct inflight {
	u64 submit_ns;
	u64 queue_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384); /* bios in flight at once; LRU: a lost completion ages out */
	__type(key, u64);
	__type(value, struct inflight);
} inflight SEC(".maps");

/*
 * How many entries `inflight` holds: zero while no bio waits in the throttle (the submission
 * hook sees only bios of limited groups) and no bio-based device is busy, and then the queue
 * and completion hooks skip their lookups. An entry the LRU drops is never subtracted: the
 * count only errs high, which costs the lookups again, never a bio.
 */
u64 inflight_entries = 0;

/*
 * The histograms live in an array, one slot per (cgroup, disk, op), so that a completion
 * reaches its histogram by index (an array lookup the JIT inlines) rather than by hashing its
 * key: `slots` says which slot a key has, the program assigns them in order of first sight
 * (`next_slot`), and a per-CPU cache remembers the last key each program saw on each CPU, so
 * that a run of completions of one tenant on one disk hashes nothing (run statistics on this
 * host: the hash lookup was ~75 of the ~170 ns a completion cost).
 * Not per CPU: 1024 slots of 5 KiB are 5 MiB, per CPU they would be that times the CPUs.
 * 1024 (cgroup, disk, op) combinations; completions beyond are counted in CNT_DROPPED, and
 * the rare completion that lost the race for a new slot to other CPUs in CNT_RACED.
 */
#define MAX_SLOTS 1024

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__type(key, struct hist_key);
	__type(value, u32);
} slots SEC(".maps");

/* Preallocated (arrays are): completions run in interrupt context, where allocating fails. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct hist_val);
} hists SEC(".maps");

/*
 * Who holds each slot handed out: a slot is taken by inserting it here (an insertion that
 * cannot overwrite is atomic), the one claim that works without the atomic fetch-and-add of
 * newer BPF instruction sets (kernels before 5.12 lack it). `next_slot` is where to try
 * next: a hint only, read and written without atomics.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SLOTS);
	__type(key, u32);
	__type(value, struct hist_key);
} slot_owner SEC(".maps");

u32 next_slot = 0;

/*
 * Per CPU and per program (CACHE_*): the last key looked up and its slot. A program never
 * runs nested in itself on one CPU (the kernel skips such a run), and a slot, once given,
 * never changes its key (cgroup ids are not reused), so an entry is never read half-written
 * nor stale.
 */
struct slot_cache {
	struct hist_key key;
	u32 slot;
	u32 valid;
};

#define CACHE_RQ 0
#define CACHE_BIO 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct slot_cache);
} slot_cache SEC(".maps");

/* Rare events, for the loader's diagnostics (indices mirrored in loader.rs). */
#define CNT_UNMATCHED 0  /* completions of bios not seen queued (queued before loading) */
#define CNT_DROPPED 1    /* completions not recorded: `hists` was full */
#define CNT_RACED 2      /* completions not recorded: other CPUs took the slots it tried */
#define CNT_MAX 3
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, u32);
	__type(value, u64);
} counters SEC(".maps");

static __always_inline void count(u32 idx)
{
	u64 *c = bpf_map_lookup_elem(&counters, &idx);

	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline u32 log2_u64(u64 v)
{
	u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline void record(struct hist *h, u64 ns)
{
	u64 us = ns / 1000;
	/* 64-bit indices: a 32-bit one is zero-extended into a copy the older verifiers do not
	 * tie to the register that was bounds-checked */
	u64 slot = us ? log2_u64(us) : 0, sub, idx;

	if (slot >= SLOTS) {
		slot = SLOTS - 1;
		sub = SUB - 1;
	} else if (slot >= SUB_BITS) {
		sub = (us >> (slot - SUB_BITS)) & (SUB - 1);
	} else {
		sub = (us << (SUB_BITS - slot)) & (SUB - 1);
	}
	idx = slot * SUB + sub;
	/*
	 * For the verifier, which cannot follow the arithmetic above (6.1's loses the bounds of
	 * a clamped value): checks on the very registers used as indices, never taken.
	 */
	barrier_var(idx);
	if (idx >= SLOTS * SUB)
		return;
	barrier_var(slot);
	if (slot >= SLOTS)
		return;
	__sync_fetch_and_add(&h->fine[idx], 1);
	__sync_fetch_and_add(&h->slot_ns[slot], ns);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
}

/* The operation from a bio's flags and size (direct loads: the bio is a BTF pointer). */
static __always_inline int classify(u32 opf, u32 size)
{
	switch (opf & REQ_OP_MASK) {
	case REQ_OP_READ:
		return OP_READ;
	case REQ_OP_WRITE:
		/* fsync's cache flush is an empty write with REQ_PREFLUSH */
		return size == 0 ? OP_FLUSH : OP_WRITE;
	case REQ_OP_WRITE_ZEROES:
		return OP_WRITE;
	case REQ_OP_FLUSH:
		return OP_FLUSH;
	case REQ_OP_DISCARD:
	case REQ_OP_SECURE_ERASE:
		return OP_DISCARD;
	default:
		return -1;
	}
}

/* The owner (cgroup id) and whole disk (major << 20 | minor) of a bio. */
static __always_inline u64 bio_cgroup(struct bio *bio)
{
	struct blkcg_gq *blkg = bio->bi_blkg;
	struct blkcg *blkcg;
	struct cgroup *cg;
	struct kernfs_node *kn;

	if (!blkg)
		return 0;
	blkcg = blkg->blkcg;
	if (!blkcg)
		return 0;
	cg = blkcg->css.cgroup;
	if (!cg)
		return 0;
	kn = cg->kn;
	return kn ? kn->id : 0;
}

static __always_inline u32 bio_disk(struct bio *bio)
{
	struct block_device *bdev = bio->bi_bdev;
	struct gendisk *disk = bdev ? bdev->bd_disk : 0;

	return disk ? ((u32)disk->major << 20) | (u32)disk->first_minor : 0;
}

/*
 * A bio's address as a number, for a map key: the verifier keeps a pointer's type through
 * casts, and a global function takes no BTF pointers, so the value goes through the stack.
 */
static __always_inline u64 bio_addr(struct bio *bio)
{
	u64 addr = 0;

	bpf_probe_read_kernel(&addr, sizeof(addr), &bio);
	return addr;
}

/* The attach target is set by the loader (__blk_throtl_bio, else submit_bio_noacct). */
SEC("fentry/submit_bio_noacct")
int BPF_PROG(iolat_submit, struct bio *bio)
{
	struct inflight f = { .submit_ns = bpf_ktime_get_ns() };
	u64 key = (u64)bio;

	/* A stacked device resubmits the same bio: keep the first submission. */
	if (!bpf_map_update_elem(&inflight, &key, &f, BPF_NOEXIST))
		__sync_fetch_and_add(&inflight_entries, 1);
	return 0;
}

/* Set by the loader before loading: whether iolat_submit is loaded (it has its own section,
 * so that the loader finds it without knowing the layout of .rodata). */
const volatile bool submit_hook SEC(".rodata.hook") = false;

SEC("tp_btf/block_bio_queue")
int BPF_PROG(iolat_queue, struct bio *bio)
{
	u64 key = (u64)bio, now;
	struct inflight *f;

	if (submit_hook && inflight_entries) {
		f = bpf_map_lookup_elem(&inflight, &key);
		if (f) {
			if (!f->queue_ns)
				f->queue_ns = bpf_ktime_get_ns();
			return 0;
		}
	}
	/*
	 * Not seen at submission. A blk-mq request keeps its own start time (start_time_ns,
	 * set when it is allocated for this bio), which iolat_rq_complete reads: only bios of
	 * bio-based devices (dm, md) need a map entry, and the common path stays map-free.
	 */
	{
		struct block_device *bdev = bio->bi_bdev;
		struct gendisk *disk = bdev ? bdev->bd_disk : 0;
		struct request_queue *q = disk ? disk->queue : 0;

		if (q && q->mq_ops)
			return 0;
	}
	now = bpf_ktime_get_ns();
	{
		struct inflight fresh = { .queue_ns = now };

		if (!bpf_map_update_elem(&inflight, &key, &fresh, BPF_NOEXIST))
			__sync_fetch_and_add(&inflight_entries, 1);
	}
	return 0;
}

/*
 * The histograms of (cgroup, disk, op): from the caller's cache entry when it holds that key,
 * else from `slots`, giving the key the next free slot on first sight. NULL when every slot
 * is taken.
 */
static __always_inline struct hist_val *hists_of(struct hist_key *hk, u32 cache_idx)
{
	struct slot_cache *c = bpf_map_lookup_elem(&slot_cache, &cache_idx);
	u32 *found, slot;

	if (c && c->valid && c->key.cgroup_id == hk->cgroup_id && c->key.dev == hk->dev &&
	    c->key.op == hk->op)
		return bpf_map_lookup_elem(&hists, &c->slot);
	found = bpf_map_lookup_elem(&slots, hk);
	if (found) {
		slot = *found;
	} else {
		int i, claimed = 0;

		/* A few tries: other CPUs may be claiming the same slots (then this completion
		 * is dropped, and the next one of this key tries again). */
#pragma unroll
		for (i = 0; i < 4 && !claimed; i++) {
			slot = next_slot;
			if (slot >= MAX_SLOTS)
				return 0;
			next_slot = slot + 1;
			claimed = !bpf_map_update_elem(&slot_owner, &slot, hk, BPF_NOEXIST);
		}
		if (!claimed)
			return 0;
		/* Another CPU may have given this key a slot meanwhile: then that one counts
		 * (this slot stays unused: nothing in `slots` names it). */
		if (bpf_map_update_elem(&slots, hk, &slot, BPF_NOEXIST)) {
			found = bpf_map_lookup_elem(&slots, hk);
			if (!found)
				return 0;
			slot = *found;
		}
	}
	if (c) {
		c->key = *hk;
		c->slot = slot;
		c->valid = 1;
	}
	return bpf_map_lookup_elem(&hists, &slot);
}

/*
 * Records one completed bio, from values its caller read (a global function: the verifier
 * checks it once, not once per call site and loop iteration; it gets numbers, not pointers).
 * dev_op: the disk << 32 | the caller's cache (CACHE_*) << 16 | the operation (BPF functions
 * take five arguments; an unknown operation, -1, reads as 0xffff); rq_start_ns:
 * the request's start time, used when the bio has no map entry.
 */
__noinline int finish_bio(u64 key, u64 cgroup_id, u64 dev_op, u64 now, u64 rq_start_ns)
{
	u32 dev = dev_op >> 32, op = dev_op & 0xffff, cache_idx = (dev_op >> 16) & 1;
	/* key 0: the caller knows there is no entry (a blk-mq bio without the submission hook) */
	struct inflight *f = key && inflight_entries ? bpf_map_lookup_elem(&inflight, &key) : 0;
	struct hist_key hk = {};
	struct hist_val *v;
	u64 submit_ns, queue_ns;
	bool seen_at_submit;

	if (f) {
		queue_ns = f->queue_ns ? f->queue_ns : f->submit_ns;
		submit_ns = f->submit_ns ? f->submit_ns : queue_ns;
		seen_at_submit = f->submit_ns != 0;
		if (!bpf_map_delete_elem(&inflight, &key))
			__sync_fetch_and_sub(&inflight_entries, 1);
	} else if (rq_start_ns) {
		/* a blk-mq request's bio, timed from the request's allocation */
		queue_ns = submit_ns = rq_start_ns;
		seen_at_submit = false;
	} else {
		count(CNT_UNMATCHED);
		return 0;
	}
	if (op > OP_DISCARD || now < queue_ns)
		return 0;

	hk.op = op;
	hk.cgroup_id = cgroup_id;
	hk.dev = dev;
	v = hists_of(&hk, cache_idx);
	if (!v) {
		/* hists_of fails for a full map or a lost race; with free slots left, the race */
		count(next_slot >= MAX_SLOTS ? CNT_DROPPED : CNT_RACED);
		return 0;
	}
	record(&v->total, now - submit_ns);
	/* Without the submission hook total and service are the same time: the loader copies.
	 * With it, a bio it did not see never entered the throttle: its service is its total. */
	if (seen_at_submit) {
		record(&v->queued, queue_ns - submit_ns);
		record(&v->service, now - queue_ns);
	} else if (submit_hook) {
		record(&v->service, now - submit_ns);
	}
	return 0;
}

SEC("tp_btf/block_bio_complete")
int BPF_PROG(iolat_bio_complete, struct request_queue *q, struct bio *bio)
{
	u32 op = classify(bio->bi_opf, bio->bi_iter.bi_size);

	finish_bio(bio_addr(bio), bio_cgroup(bio),
		   ((u64)bio_disk(bio) << 32) | (CACHE_BIO << 16) | (op & 0xffff),
		   bpf_ktime_get_ns(), 0);
	return 0;
}

/* How many bios of one request are walked: merges of more are rare (and then undercounted). */
#define MAX_BIOS_PER_RQ 32

SEC("tp_btf/block_rq_complete")
int BPF_PROG(iolat_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	u64 now = bpf_ktime_get_ns();
	struct bio *bio = rq->bio;
	/* zero when the queue keeps no time stamps (iostats off, no scheduler) */
	u64 start = rq->start_time_ns;
	u64 done = 0, cgroup_id;
	u32 dev;
	int i;

	if (!bio)
		return 0;
	/* The bios of one request share their disk and their blkg (blk_cgroup_mergeable). */
	cgroup_id = bio_cgroup(bio);
	dev = bio_disk(bio);
	/*
	 * Fires before the bios are ended; a partial completion (nr_bytes short of the request)
	 * ends only the bios it covers, and fires again for the rest. A flush without data
	 * covers its one empty bio.
	 */
	for (i = 0; i < MAX_BIOS_PER_RQ && bio; i++) {
		u32 size = bio->bi_iter.bi_size;

		if (size && done + size > nr_bytes)
			break;
		done += size;
		finish_bio(submit_hook ? bio_addr(bio) : 0, cgroup_id,
			   ((u64)dev << 32) | (CACHE_RQ << 16) | (classify(bio->bi_opf, size) & 0xffff),
			   now, start);
		bio = bio->bi_next;
	}
	return 0;
}
