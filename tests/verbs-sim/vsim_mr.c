/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Protection domains and memory regions.
 *
 * An MR lives in a registry slot so that any process can validate a key:
 * the key names the slot (key >> 8) and a tag (key & 0xff) that changes on
 * every reuse, so a stale key fails as it does on hardware. lkey == rkey.
 * Keys address IOVA space ([iova, iova+length)), which is the virtual
 * address unless the MR was registered with ibv_reg_mr_iova*.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

/* Bytes "pinned" by this process, checked against RLIMIT_MEMLOCK. */
static uint64_t pinned_bytes;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;

VSIM_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct vsim_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	vsim_lock(&vsim_reg->lock);
	pd->id = vsim_reg->next_pd++;
	vsim_unlock(&vsim_reg->lock);
	pd->ibpd.context = context;
	pd->ibpd.handle = (uint32_t)pd->id;
	return &pd->ibpd;
}

VSIM_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct vsim_pd *pd = to_vpd(ibpd);

	/* The kernel refuses to free a PD that MRs, QPs or SRQs still use. */
	if (atomic_load(&pd->refs))
		return EBUSY;
	free(pd);
	return 0;
}

/* Are all pages of [addr, addr+len) mapped? */
static int range_mapped(const void *addr, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
	uintptr_t end = ((uintptr_t)addr + len + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
	unsigned char vec[256];

	while (start < end) {
		size_t n = (end - start) / (size_t)page;

		if (n > sizeof(vec))
			n = sizeof(vec);
		if (mincore((void *)start, n * (size_t)page, vec))
			return 0;
		start += n * (size_t)page;
	}
	return 1;
}

static uint64_t page_span(const void *addr, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
	uintptr_t end = ((uintptr_t)addr + len + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);

	return end - start;
}

static struct ibv_mr *reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
			     unsigned int access)
{
	const unsigned known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			       IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB |
			       IBV_ACCESS_OPTIONAL_RANGE;
	struct vsim_context *c = to_vctx(ibpd->context);
	struct vsim_pd *pd = to_vpd(ibpd);
	struct vsim_mr *mr;
	struct rlimit rl;
	uint64_t span;
	int i, slot = -1;

	if (access & ~known) {
		/* ODP and zero-based MRs are not emulated. */
		errno = EINVAL;
		return NULL;
	}
	/* The IB rule: remote write or atomic needs local write. */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if (length == 0 || !addr || (uint64_t)length > (1ULL << 40) ||
	    iova + length < iova) {
		errno = EINVAL;
		return NULL;
	}
	if (!range_mapped(addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	span = page_span(addr, length);
	pthread_mutex_lock(&pinned_lock);
	if (geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
	    rl.rlim_cur != RLIM_INFINITY && pinned_bytes + span > rl.rlim_cur) {
		pthread_mutex_unlock(&pinned_lock);
		vsim_dbg("reg_mr: %zu bytes exceed RLIMIT_MEMLOCK", length);
		errno = ENOMEM;
		return NULL;
	}
	pinned_bytes += span;
	pthread_mutex_unlock(&pinned_lock);

	mr = calloc(1, sizeof(*mr));
	if (!mr)
		goto unpin;
	vsim_lock(&vsim_reg->lock);
	for (i = 0; i < VSIM_MAX_MR; i++) {
		uint32_t s = (vsim_reg->mr_hint + (uint32_t)i) % VSIM_MAX_MR;

		/* Slot 0 is never used so that no key is 0..255. */
		if (s != 0 && !vsim_reg->mr[s].used) {
			slot = (int)s;
			break;
		}
	}
	if (slot > 0) {
		struct vsim_mr_slot *m = &vsim_reg->mr[slot];

		vsim_reg->mr_hint = (uint32_t)slot + 1;
		memset(m, 0, sizeof(*m));
		m->used = 1;
		m->key = ((uint32_t)slot << 8) | (vsim_reg->mr_tag++ & 0xff);
		vsim_self_owner(&m->owner);
		m->owner.ctx_slot = c->slot;
		m->owner.ctx_gen = c->gen;
		m->pd_id = pd->id;
		m->addr = (uintptr_t)addr;
		m->length = length;
		m->iova = iova;
		m->access = access;
		mr->ibmr.lkey = mr->ibmr.rkey = m->key;
	}
	vsim_unlock(&vsim_reg->lock);
	if (slot <= 0) {
		free(mr);
		goto unpin;
	}
	mr->slot = (uint32_t)slot;
	mr->pinned = span;
	mr->ibmr.context = ibpd->context;
	mr->ibmr.pd = ibpd;
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->ibmr.handle = (uint32_t)slot;
	atomic_fetch_add(&pd->refs, 1);
	return &mr->ibmr;

unpin:
	pthread_mutex_lock(&pinned_lock);
	pinned_bytes -= span;
	pthread_mutex_unlock(&pinned_lock);
	errno = ENOMEM;
	return NULL;
}

/* Binaries bind to one of three entries, depending on how the access flags
 * were written at the call site (see __ibv_reg_mr in verbs.h). */
VSIM_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

VSIM_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					   uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned)access);
}

VSIM_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					    uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

VSIM_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					     uint64_t iova, int fd, int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

VSIM_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
			     size_t length, int access)
{
	(void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
	/* The old MR stays valid, as the man page promises for this code. */
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

VSIM_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct vsim_mr *mr = to_vmr(ibmr);
	struct vsim_mr_slot *m = &vsim_reg->mr[mr->slot];
	uint64_t deadline = vsim_now_ns() + 5000000000ULL;

	/* After dereg returns, no DMA may touch the memory: wait for
	 * placements in progress (bounded, in case the writer died). */
	vsim_lock(&vsim_reg->lock);
	m->used = 0;
	vsim_unlock(&vsim_reg->lock);
	while (atomic_load(&m->busy) && vsim_now_ns() < deadline)
		vsim_sleep_ns(100000);
	atomic_store(&m->busy, 0);

	pthread_mutex_lock(&pinned_lock);
	pinned_bytes -= mr->pinned;
	pthread_mutex_unlock(&pinned_lock);
	atomic_fetch_sub(&to_vpd(ibmr->pd)->refs, 1);
	free(mr);
	return 0;
}

/*
 * Validates (key, iova, len) for an access: the key is live, belongs to the
 * owner process and PD expected, grants 'need', and covers the range. On
 * success the range is translated to the owner's virtual address; with
 * mark_busy, dereg waits until vsim_mr_unbusy().
 */
int vsim_mr_lookup(uint32_t key, const struct vsim_owner *owner, uint64_t pd_id,
		   uint64_t iova, uint64_t len, unsigned need, int mark_busy,
		   struct vsim_mr_ref *ref)
{
	uint32_t slot = key >> 8;
	struct vsim_mr_slot *m;
	int ok;

	if (slot == 0 || slot >= VSIM_MAX_MR)
		return VSIM_KEY_BAD;
	m = &vsim_reg->mr[slot];
	vsim_lock(&vsim_reg->lock);
	ok = m->used && m->key == key && m->owner.pid == owner->pid &&
	     m->owner.starttime == owner->starttime && m->pd_id == pd_id &&
	     (m->access & need) == need && iova >= m->iova && len <= m->length &&
	     iova - m->iova <= m->length - len;
	if (ok) {
		ref->slot = slot;
		ref->va = m->addr + (iova - m->iova);
		ref->access = m->access;
		if (mark_busy)
			atomic_fetch_add(&m->busy, 1);
	}
	vsim_unlock(&vsim_reg->lock);
	return ok ? VSIM_KEY_OK : VSIM_KEY_BAD;
}

void vsim_mr_unbusy(uint32_t slot)
{
	struct vsim_mr_slot *m = &vsim_reg->mr[slot];
	uint32_t b = atomic_load(&m->busy);

	/* dereg may have given up waiting and cleared it. */
	while (b && !atomic_compare_exchange_weak(&m->busy, &b, b - 1))
		;
}
