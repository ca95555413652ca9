/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Multi-process RC tests: forked processes connect their QPs through an
 * out-of-band socketpair, as real code would through TCP or PMIx, and move
 * data with standard verbs. Every transfer's content is checked.
 *
 *   vsim_rdma write      WRITE WITH IMM, WRITE + 0-byte WRITE WITH IMM,
 *                        WRITE + flag WRITE, SEND WITH IMM, RDMA READ
 *   vsim_rdma lastbyte --expect broken|intact
 *                        polling the last bytes of a single WRITE (the
 *                        negative control), next to the correct methods
 *   vsim_rdma late --expect late|ontime
 *                        a send completion does not mean the data is there
 *   vsim_rdma errors     remote access errors, flushes, RNR, bad requests
 *   vsim_rdma peerdeath  a killed responder: RETRY_EXC_ERR, not a hang
 *   vsim_rdma channel    completion channels across processes
 *   vsim_rdma srq        one SRQ and one CQ shared by two connections
 *   vsim_rdma twonode    two simulated hosts (different LIDs / GIDs)
 *   vsim_rdma wholeword  the final aligned word of a WRITE is stored by the
 *                        responder's process, not copied by the kernel
 *
 * Parent = requester, child = responder, unless said otherwise.
 */
#define _GNU_SOURCE
#include "vsim_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024 * 1024)
#define BUFSZ (4 * MIB)
#define SEND_OFF (2 * MIB)       /* responder: where SENDs land */
#define READ_OFF (2 * MIB)       /* requester: where READs land */
#define FLAG_OFF (BUFSZ - 64)    /* responder: the flag word */
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static const char *expect = "";

struct side {
	struct t_ep ep;
	unsigned char *buf;
	struct ibv_mr *mr;
	struct t_addr me, peer;
};

static int setup(struct side *s, int fd, uint32_t psn, unsigned access)
{
	int rc = t_open(&s->ep);

	if (rc)
		return rc;
	s->buf = aligned_alloc(4096, BUFSZ);
	T_CHECK(s->buf, "allocation");
	memset(s->buf, 0, BUFSZ);
	s->mr = ibv_reg_mr(s->ep.pd, s->buf, BUFSZ, ALL_ACCESS);
	T_CHECK(s->mr, "ibv_reg_mr: %s", strerror(errno));
	T_CHECK(t_create_qp(&s->ep, 64, 64, NULL) == 0, "create QP");
	t_local_addr(&s->ep, psn, &s->me);
	s->me.addr = (uintptr_t)s->buf;
	s->me.rkey = s->mr->rkey;
	s->me.len = BUFSZ;
	T_CHECK(t_send(fd, &s->me, sizeof(s->me)) == 0 &&
		t_recv(fd, &s->peer, sizeof(s->peer)) == 0, "address exchange");
	rc = t_connect(&s->ep, &s->peer, psn, access, 12, 3, 7);
	T_CHECK(rc == 0, "connect: %s", strerror(rc));
	/* Both sides in RTS before any traffic. */
	T_CHECK(t_send_u32(fd, 1) == 0 && t_recv_u32(fd) == 1, "barrier");
	return 0;
}

static void teardown(struct side *s)
{
	if (s->mr)
		ibv_dereg_mr(s->mr);
	t_close(&s->ep);
	free(s->buf);
}

static int barrier(int fd)
{
	return t_send_u32(fd, 0xba) == 0 && t_recv_u32(fd) == 0xba ? 0 : -1;
}

static void fill(unsigned char *p, uint32_t k, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = t_pattern(k, i);
}

/* Bytes of p[0..n) that differ from message k. */
static size_t mismatches(const volatile unsigned char *p, uint32_t k, size_t n)
{
	size_t i, bad = 0;

	for (i = 0; i < n; i++)
		bad += p[i] != t_pattern(k, i);
	return bad;
}

static int wait_ok(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;

	T_CHECK(t_wait_cqe(cq, &wc) == 0, "completion");
	T_CHECK(wc.status == IBV_WC_SUCCESS, "wr %llu: %s", (unsigned long long)wc.wr_id,
		ibv_wc_status_str(wc.status));
	T_CHECK(wc.wr_id == wr_id && wc.opcode == op, "wr_id %llu opcode %d, expected %llu %d",
		(unsigned long long)wc.wr_id, wc.opcode, (unsigned long long)wr_id, op);
	return 0;
}

static int post_write2(struct ibv_qp *qp, void *buf, size_t n, uint32_t lkey, uint64_t raddr,
		       uint32_t rkey, enum ibv_wr_opcode op2, void *buf2, size_t n2,
		       uint64_t raddr2, uint32_t imm, uint64_t id2)
{
	/* Two WRs in one post: the body (unsignaled) and a second write. */
	struct ibv_sge s1 = { (uintptr_t)buf, (uint32_t)n, lkey };
	struct ibv_sge s2 = { (uintptr_t)buf2, (uint32_t)n2, lkey };
	struct ibv_send_wr w1, w2, *bad;

	memset(&w1, 0, sizeof(w1));
	memset(&w2, 0, sizeof(w2));
	w1.wr_id = id2 - 1;
	w1.opcode = IBV_WR_RDMA_WRITE;
	w1.sg_list = &s1;
	w1.num_sge = 1;
	w1.wr.rdma.remote_addr = raddr;
	w1.wr.rdma.rkey = rkey;
	w1.next = &w2;
	w2.wr_id = id2;
	w2.opcode = op2;
	w2.sg_list = n2 ? &s2 : NULL;
	w2.num_sge = n2 ? 1 : 0;
	w2.send_flags = IBV_SEND_SIGNALED;
	w2.imm_data = htonl(imm);
	w2.wr.rdma.remote_addr = raddr2;
	w2.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &w1, &bad);
}

/* One WR of op with the two-SGE list {p0, n0}, {p1, n1}. */
static int post_sge2(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, void *p0, size_t n0,
		     void *p1, size_t n1, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		     uint32_t imm)
{
	struct ibv_sge sg[2] = { { (uintptr_t)p0, (uint32_t)n0, lkey },
				 { (uintptr_t)p1, (uint32_t)n1, lkey } };
	struct ibv_send_wr w, *bad;

	memset(&w, 0, sizeof(w));
	w.wr_id = id;
	w.opcode = op;
	w.sg_list = sg;
	w.num_sge = 2;
	w.send_flags = IBV_SEND_SIGNALED;
	w.imm_data = htonl(imm);
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &w, &bad);
}

/* ---- write: every correct way to move and detect data ------------------- */

static const size_t sizes[] = { 8, 24, 4096, 65544, MIB };

static int iters_for(size_t n)
{
	return n >= MIB ? 2 : 8;
}

static int write_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	uint32_t k = 1;
	size_t z;
	int rc = setup(&s, fd, 1000, ALL_ACCESS), it;

	(void)child, (void)arg;
	if (rc)
		return rc;
	for (z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		size_t n = sizes[z];

		for (it = 0; it < iters_for(n); it++) {
			/* a) WRITE WITH IMM of the whole message. */
			fill(s.buf, k, n);
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, s.buf, n,
					     s.mr->lkey, s.peer.addr, s.peer.rkey, k,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
				return 1;
			k++;
			/* b) WRITE, then a 0-byte WRITE WITH IMM on the same QP. */
			fill(s.buf, k, n);
			T_CHECK(post_write2(s.ep.qp, s.buf, n, s.mr->lkey, s.peer.addr, s.peer.rkey,
					    IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, k, k) == 0,
				"post");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
				return 1;
			k++;
			/* c) WRITE, then an 8-byte flag WRITE on the same QP. */
			fill(s.buf, k, n);
			memcpy(s.buf + FLAG_OFF, &(uint64_t){ k }, 8);
			T_CHECK(post_write2(s.ep.qp, s.buf, n, s.mr->lkey, s.peer.addr, s.peer.rkey,
					    IBV_WR_RDMA_WRITE, s.buf + FLAG_OFF, 8,
					    s.peer.addr + FLAG_OFF, 0, k) == 0, "post");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
				return 1;
			k++;
			/* d) SEND WITH IMM into a posted receive buffer. */
			fill(s.buf, k, n);
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_SEND_WITH_IMM, k, s.buf, n, s.mr->lkey,
					     0, 0, k, IBV_SEND_SIGNALED) == 0, "post");
			if (wait_ok(s.ep.scq, k, IBV_WC_SEND) || t_recv_u32(fd) != k)
				return 1;
			k++;
			/* e) RDMA READ of what the responder wrote locally. */
			T_CHECK(t_recv_u32(fd) == k, "responder ready for read %u", k);
			memset(s.buf + READ_OFF, 0, n);
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_READ, k, s.buf + READ_OFF, n,
					     s.mr->lkey, s.peer.addr, s.peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post read");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_READ))
				return 1;
			T_CHECK(mismatches(s.buf + READ_OFF, k, n) == 0, "READ of %zu bytes", n);
			T_CHECK(t_send_u32(fd, k) == 0, "ack");
			k++;
			/* f) WRITE WITH IMM gathering two SGEs listed against
			 * address order, the first of an odd length. */
			size_t h = n > 6 ? n / 2 - 3 : 1;
			unsigned char *hi = s.buf + READ_OFF + MIB;
			fill(s.buf, k, n);
			memcpy(hi, s.buf, h);
			T_CHECK(post_sge2(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, hi, h, s.buf + h,
					  n - h, s.mr->lkey, s.peer.addr, s.peer.rkey, k) == 0,
				"post gathered write");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
				return 1;
			k++;
			/* g) RDMA READ scattered over two SGEs. */
			T_CHECK(t_recv_u32(fd) == k, "responder ready for read %u", k);
			memset(hi, 0, h);
			memset(s.buf + READ_OFF, 0, n - h);
			T_CHECK(post_sge2(s.ep.qp, IBV_WR_RDMA_READ, k, hi, h, s.buf + READ_OFF,
					  n - h, s.mr->lkey, s.peer.addr, s.peer.rkey, 0) == 0,
				"post scattered read");
			if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_READ))
				return 1;
			T_CHECK(mismatches(hi, k, h) == 0, "scattered READ: first SGE");
			for (size_t i = 0; i < n - h; i++)
				T_CHECK(s.buf[READ_OFF + i] == t_pattern(k, h + i),
					"scattered READ: second SGE, byte %zu", i);
			T_CHECK(t_send_u32(fd, k) == 0, "ack");
			k++;
		}
		t_log("%zu bytes: write+imm, write+0-byte imm, write+flag, send, read, "
		      "2-SGE write+imm and read: ok", n);
	}
	T_CHECK(barrier(fd) == 0, "barrier");
	teardown(&s);
	return 0;
}

static int recv_check(struct side *s, uint32_t k, size_t n, enum ibv_wc_opcode op,
		      const unsigned char *where)
{
	struct ibv_wc wc;

	T_CHECK(t_wait_cqe(s->ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS,
		"receive completion: %s", ibv_wc_status_str(wc.status));
	T_CHECK(wc.opcode == op && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == k,
		"opcode %d imm %u, expected %d %u", wc.opcode, ntohl(wc.imm_data), op, k);
	T_CHECK(wc.qp_num == s->ep.qp->qp_num && wc.src_qp == s->peer.qpn, "qp_num/src_qp");
	T_CHECK(s->ep.roce || wc.slid == s->peer.lid, "slid %u", wc.slid);
	/* The data is complete once the completion is visible. */
	T_CHECK(mismatches(where, k, n) == 0, "%zu of %zu bytes wrong at the completion",
		mismatches(where, k, n), n);
	/* Keep the receive queue full (the buffer serves SENDs). */
	T_CHECK(t_post_recv(s->ep.qp, k, s->buf + SEND_OFF, MIB, s->mr->lkey) == 0, "repost");
	return 0;
}

static int write_child(int fd, void *arg)
{
	struct side s = { 0 };
	volatile uint64_t *flag;
	uint32_t k = 1;
	size_t z;
	int rc = setup(&s, fd, 2000, ALL_ACCESS), it, i;

	(void)arg;
	if (rc)
		return rc;
	flag = (volatile uint64_t *)(s.buf + FLAG_OFF);
	for (i = 0; i < 32; i++)
		T_CHECK(t_post_recv(s.ep.qp, 0, s.buf + SEND_OFF, MIB, s.mr->lkey) == 0,
			"post_recv");
	for (z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		size_t n = sizes[z];

		for (it = 0; it < iters_for(n); it++) {
			if (recv_check(&s, k, n, IBV_WC_RECV_RDMA_WITH_IMM, s.buf))
				return 1;
			T_CHECK(t_send_u32(fd, k++) == 0, "ack");
			if (recv_check(&s, k, n, IBV_WC_RECV_RDMA_WITH_IMM, s.buf))
				return 1;
			T_CHECK(t_send_u32(fd, k++) == 0, "ack");
			/* Write-after-write on one QP: flag seen => body there. */
			while (*flag != k)
				;
			T_CHECK(mismatches(s.buf, k, n) == 0, "body not complete when the flag "
				"written after it on the same QP was seen");
			T_CHECK(t_send_u32(fd, k++) == 0, "ack");
			if (recv_check(&s, k, n, IBV_WC_RECV, s.buf + SEND_OFF))
				return 1;
			T_CHECK(t_send_u32(fd, k++) == 0, "ack");
			fill(s.buf, k, n);
			T_CHECK(t_send_u32(fd, k) == 0 && t_recv_u32(fd) == k, "read handshake");
			k++;
			if (recv_check(&s, k, n, IBV_WC_RECV_RDMA_WITH_IMM, s.buf))
				return 1;
			T_CHECK(t_send_u32(fd, k++) == 0, "ack");
			fill(s.buf, k, n);
			T_CHECK(t_send_u32(fd, k) == 0 && t_recv_u32(fd) == k, "read handshake");
			k++;
		}
	}
	T_CHECK(barrier(fd) == 0, "barrier");
	teardown(&s);
	return 0;
}

/* ---- lastbyte: the negative control ------------------------------------- */

/* At least LB_MIN writes; when expecting breakage on a loaded machine,
 * keep going (up to LB_MAX) until the early tail has been caught once. */
#define LB_MIN 20
#define LB_MAX 200

static int lastbyte_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	uint32_t k, last = 0, end;
	int rc = setup(&s, fd, 3000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	/* The responder says which write it is armed for; 0 ends. */
	while ((k = t_recv_u32(fd)) != 0) {
		size_t n = k % 2 ? 65536 : 4096;
		uint64_t tail = k;

		T_CHECK(k == last + 1, "responder armed for %u", k);
		last = k;
		fill(s.buf, k, n - 8);
		memcpy(s.buf + n - 8, &tail, 8);
		/* One single RDMA WRITE: body and tail in the same message. */
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, k, s.buf, n, s.mr->lkey,
				     s.peer.addr, s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE))
			return 1;
		T_CHECK(t_send_u32(fd, k) == 0, "done");
	}
	/* The same data detected correctly: by WRITE WITH IMM completion. */
	for (k = last + 1, end = last + 5; k <= end; k++) {
		fill(s.buf, k, 65536);
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, s.buf, 65536,
				     s.mr->lkey, s.peer.addr, s.peer.rkey, k,
				     IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
			return 1;
	}
	teardown(&s);
	return 0;
}

static int lastbyte_child(int fd, void *arg)
{
	struct side s = { 0 };
	int rc = setup(&s, fd, 4000, ALL_ACCESS), stale = 0, in_order, i;
	int broken = !strcmp(expect, "broken");
	uint32_t k, end;

	(void)arg;
	if (rc)
		return rc;
	in_order = ibv_query_qp_data_in_order(s.ep.qp, IBV_WR_RDMA_WRITE, 0);
	for (i = 0; i < 8; i++)
		T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0, "post_recv");
	for (k = 1; k <= LB_MIN || (broken && !stale && k <= LB_MAX); k++) {
		size_t n = k % 2 ? 65536 : 4096, i2, bad;
		volatile uint64_t *tail = (volatile uint64_t *)(s.buf + n - 8);
		uint64_t seen;

		/* Arm: stale body (never equal to the message), tail 0. */
		for (i2 = 0; i2 < n - 8; i2++)
			s.buf[i2] = (unsigned char)~t_pattern(k, i2);
		*tail = 0;
		T_CHECK(t_send_u32(fd, k) == 0, "armed");
		/* Last-byte polling: wrong unless the device places in order. */
		while ((seen = *tail) == 0)
			;
		bad = mismatches(s.buf, k, n - 8);
		T_CHECK(seen == k, "tail %llu, expected %u", (unsigned long long)seen, k);
		if (bad) {
			stale++;
			if (stale == 1)
				t_log("write %u (%zu bytes): tail seen with %zu body bytes "
				      "still stale", k, n, bad);
		}
		T_CHECK(t_recv_u32(fd) == k, "done");
		/* Complete by now: the requester saw its completion, and the
		 * tail (placed last or not) was already visible. */
		T_CHECK(mismatches(s.buf, k, n - 8) == 0, "body incomplete after the tail");
	}
	T_CHECK(t_send_u32(fd, 0) == 0, "finished");
	t_log("last-byte polling saw a stale body in %d of %u writes; "
	      "ibv_query_qp_data_in_order = %d", stale, k - 1, in_order);
	for (end = k + 4; k <= end; k++) {
		struct ibv_wc wc;

		T_CHECK(t_wait_cqe(s.ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
			ntohl(wc.imm_data) == k, "write-with-imm completion");
		T_CHECK(mismatches(s.buf, k, 65536) == 0, "data complete at the imm completion");
		T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0 && t_send_u32(fd, k) == 0, "ack");
	}
	t_log("write-with-imm detection: 5 of 5 complete at their completion");
	T_CHECK(in_order == 0 || stale == 0,
		"ibv_query_qp_data_in_order promised order, but the tail landed early");
	if (broken) {
		T_CHECK(stale > 0, "negative control: last-byte polling of a single write "
			"must fail under this placement, but never did");
		T_CHECK(in_order == 0, "this placement must not claim in-order data");
		t_log("negative control: last-byte polling broke, as it must here");
	} else {
		T_CHECK(stale == 0, "placement must keep the tail last");
	}
	teardown(&s);
	return 0;
}

/* ---- late: a send completion does not mean remote visibility ------------ */

static int late_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	uint32_t k;
	int rc = setup(&s, fd, 5000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	for (k = 1; k <= 10; k++) {
		fill(s.buf, k, 65536);
		T_CHECK(t_recv_u32(fd) == k, "armed");
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, k, s.buf, 65536, s.mr->lkey,
				     s.peer.addr, s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE))
			return 1;
		/* Tell the responder at once, through another channel. */
		T_CHECK(t_send_u32(fd, k) == 0, "completed");
		/* Reusing the buffer after the completion is legal. */
		memset(s.buf, 0, 65536);
		memcpy(s.buf + FLAG_OFF, &(uint64_t){ k }, 8);
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, k + 100, s.buf + FLAG_OFF, 8,
				     s.mr->lkey, s.peer.addr + FLAG_OFF, s.peer.rkey, 0,
				     IBV_SEND_SIGNALED) == 0, "post flag");
		if (wait_ok(s.ep.scq, k + 100, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
			return 1;
	}
	/* Acknowledged data arrives even if the QP is destroyed at once. */
	fill(s.buf, 99, 65536);
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 99, s.buf, 65536, s.mr->lkey,
			     s.peer.addr, s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
	if (wait_ok(s.ep.scq, 99, IBV_WC_RDMA_WRITE))
		return 1;
	T_CHECK(ibv_destroy_qp(s.ep.qp) == 0, "ibv_destroy_qp");
	s.ep.qp = NULL;
	T_CHECK(t_send_u32(fd, 99) == 0 && t_recv_u32(fd) == 99, "data after destroy");
	teardown(&s);
	return 0;
}

static int late_child(int fd, void *arg)
{
	struct side s = { 0 };
	int rc = setup(&s, fd, 6000, ALL_ACCESS), late = 0;
	volatile uint64_t *flag;
	uint32_t k;
	size_t i;

	(void)arg;
	if (rc)
		return rc;
	flag = (volatile uint64_t *)(s.buf + FLAG_OFF);
	for (k = 1; k <= 10; k++) {
		for (i = 0; i < 65536; i++)
			s.buf[i] = (unsigned char)~t_pattern(k, i);
		T_CHECK(t_send_u32(fd, k) == 0, "armed");
		T_CHECK(t_recv_u32(fd) == k, "completed");
		if (mismatches(s.buf, k, 65536))
			late++;
		/* The flag written after the data on the same QP is reliable. */
		while (*flag != k)
			;
		T_CHECK(mismatches(s.buf, k, 65536) == 0, "data incomplete when the flag landed");
		T_CHECK(t_send_u32(fd, k) == 0, "ack");
	}
	T_CHECK(t_recv_u32(fd) == 99, "requester destroyed its QP");
	{
		unsigned char *want = malloc(65536);

		T_CHECK(want, "allocation");
		fill(want, 99, 65536);
		T_CHECK(t_wait_bytes(s.buf, want, 65536) == 0,
			"data acknowledged before the requester's QP was destroyed never came");
		free(want);
	}
	T_CHECK(t_send_u32(fd, 99) == 0, "ack");
	t_log("data not yet visible at the requester's completion in %d of 10 writes", late);
	if (!strcmp(expect, "late"))
		T_CHECK(late > 0, "delayed placement must land after the send completion");
	else
		T_CHECK(late == 0, "this placement lands before the send completion");
	teardown(&s);
	return 0;
}

/* ---- errors ------------------------------------------------------------- */

enum {
	E_BAD_RKEY = 1, E_PAST_END, E_BEFORE_START, E_MR_NO_RW, E_QP_NO_RW, E_READ_NO_RR,
	E_RNR_EXC, E_RNR_OK, E_SEND_TOO_LONG, E_LOCAL_PROT, E_ZERO_LEN, E_BAD_PSN, E_BAD_ADDR,
	E_LAST
};
static const char *const e_names[] = {
	"", "bad rkey", "write past the MR end", "write before the MR start",
	"MR without remote write", "QP without remote write", "read without remote read",
	"RNR retries exhausted", "RNR recovered", "send longer than the receive",
	"local protection error", "zero-length writes need no key", "PSN mismatch",
	"wrong destination address",
};

static int expect_cqe(struct ibv_cq *cq, uint64_t id, enum ibv_wc_status st)
{
	struct ibv_wc wc;

	T_CHECK(t_wait_cqe(cq, &wc) == 0, "completion for %llu", (unsigned long long)id);
	T_CHECK(wc.wr_id == id && wc.status == st, "wr %llu: %s, expected wr %llu: %s",
		(unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
		(unsigned long long)id, ibv_wc_status_str(st));
	return 0;
}

static int async_event(struct ibv_context *ctx, enum ibv_event_type type, struct ibv_qp *qp)
{
	struct ibv_async_event ev;
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };

	T_CHECK(poll(&pfd, 1, 20000) == 1, "no async event");
	T_CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
	T_CHECK(ev.event_type == type, "async event %s, expected %s",
		ibv_event_type_str(ev.event_type), ibv_event_type_str(type));
	T_CHECK(!qp || ev.element.qp == qp, "async event for another QP");
	ibv_ack_async_event(&ev);
	return 0;
}

static int errors_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	struct t_addr peer;
	int c, rc = setup(&s, fd, 7000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	for (c = 1; c < E_LAST; c++) {
		uint8_t rnr = c == E_RNR_EXC ? 0 : 7;
		uint32_t psn = 100u * (uint32_t)c;
		struct t_addr alt;

		if ((c == E_BAD_PSN) && !t_under_sim())
			continue;  /* what a real HCA does with it varies */
		T_CHECK(t_send_u32(fd, (uint32_t)c) == 0, "case");
		T_CHECK(t_recv(fd, &peer, sizeof(peer)) == 0, "case address");
		alt = peer;
		if (c == E_BAD_ADDR) {
			alt.lid = (uint16_t)(peer.lid + 50);
			alt.gid[15] ^= 0x5a;
		}
		rc = t_connect(&s.ep, &alt, psn, ALL_ACCESS, 8, 2, rnr);
		T_CHECK(rc == 0, "reconnect: %s", strerror(rc));
		T_CHECK(barrier(fd) == 0, "connected");
		T_CHECK(t_recv_u32(fd) == 0xcafe, "responder ready");

		switch (c) {
		case E_BAD_RKEY: {
			/* The failing WR, then two more: both flushed. */
			struct ibv_sge sg = { (uintptr_t)s.buf, 64, s.mr->lkey };
			struct ibv_send_wr w[3], *bad;
			int i;

			memset(w, 0, sizeof(w));
			for (i = 0; i < 3; i++) {
				w[i].wr_id = (uint64_t)i + 1;
				w[i].opcode = i == 2 ? IBV_WR_RDMA_WRITE_WITH_IMM :
					      IBV_WR_RDMA_WRITE;
				w[i].sg_list = &sg;
				w[i].num_sge = 1;
				w[i].send_flags = i == 1 ? 0 : IBV_SEND_SIGNALED;
				w[i].wr.rdma.remote_addr = peer.addr;
				w[i].wr.rdma.rkey = peer.rkey;
				w[i].next = i < 2 ? &w[i + 1] : NULL;
			}
			w[0].wr.rdma.rkey = peer.rkey + 0x100;
			T_CHECK(ibv_post_send(s.ep.qp, w, &bad) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_REM_ACCESS_ERR) ||
			    expect_cqe(s.ep.scq, 2, IBV_WC_WR_FLUSH_ERR) ||
			    expect_cqe(s.ep.scq, 3, IBV_WC_WR_FLUSH_ERR))
				return 1;
			break;
		}
		case E_PAST_END:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 16, s.mr->lkey,
					     peer.addr + peer.len - 8, peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_REM_ACCESS_ERR))
				return 1;
			break;
		case E_BEFORE_START:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 8, s.mr->lkey,
					     peer.addr - 8, peer.rkey, 0, IBV_SEND_SIGNALED) == 0,
				"post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_REM_ACCESS_ERR))
				return 1;
			break;
		case E_MR_NO_RW:
		case E_QP_NO_RW:
			/* A key violation is an access error; a QP that does not
			 * allow the operation at all rejects an invalid request. */
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 8, s.mr->lkey,
					     peer.addr, peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, c == E_MR_NO_RW ? IBV_WC_REM_ACCESS_ERR :
				       IBV_WC_REM_INV_REQ_ERR))
				return 1;
			break;
		case E_READ_NO_RR:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_READ, 1, s.buf, 8, s.mr->lkey,
					     peer.addr, peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_REM_ACCESS_ERR))
				return 1;
			break;
		case E_RNR_EXC:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, s.buf, 8,
					     s.mr->lkey, peer.addr, peer.rkey, 1,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_RNR_RETRY_EXC_ERR))
				return 1;
			break;
		case E_RNR_OK:
			fill(s.buf, 77, 64);
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, s.buf, 64,
					     s.mr->lkey, peer.addr, peer.rkey, 77,
					     IBV_SEND_SIGNALED) == 0, "post");
			T_CHECK(t_send_u32(fd, 1) == 0, "posted");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_SUCCESS))
				return 1;
			break;
		case E_SEND_TOO_LONG:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_SEND, 1, s.buf, 64, s.mr->lkey,
					     0, 0, 0, IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_REM_INV_REQ_ERR))
				return 1;
			break;
		case E_LOCAL_PROT:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 8,
					     s.mr->lkey + 0x100, peer.addr, peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_LOC_PROT_ERR))
				return 1;
			break;
		case E_ZERO_LEN:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, NULL, 0, 0, 0, 0, 0,
					     IBV_SEND_SIGNALED) == 0 &&
				t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, NULL, 0,
					     0, 0, 0, 5, IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_SUCCESS) ||
			    expect_cqe(s.ep.scq, 2, IBV_WC_SUCCESS))
				return 1;
			break;
		case E_BAD_PSN:
		case E_BAD_ADDR:
			T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 8, s.mr->lkey,
					     peer.addr, peer.rkey, 0,
					     IBV_SEND_SIGNALED) == 0, "post");
			if (expect_cqe(s.ep.scq, 1, IBV_WC_RETRY_EXC_ERR))
				return 1;
			break;
		}
		if (c != E_RNR_OK && c != E_ZERO_LEN)
			T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_ERR, "requester QP in ERR after %s",
				e_names[c]);
		T_CHECK(t_send_u32(fd, 0xd0e) == 0 && t_recv_u32(fd) == 0xd0e, "case end");
		t_log("%s: ok", e_names[c]);
	}
	T_CHECK(t_send_u32(fd, 0) == 0, "end");
	teardown(&s);
	return 0;
}

static int errors_child(int fd, void *arg)
{
	struct side s = { 0 };
	struct ibv_mr *mr2 = NULL;
	struct ibv_wc wc;
	uint32_t c;
	int rc = setup(&s, fd, 8000, ALL_ACCESS);

	(void)arg;
	if (rc)
		return rc;
	while ((c = t_recv_u32(fd)) != 0 && c != 0xffffffffu) {
		struct t_addr me = s.me;
		unsigned access = ALL_ACCESS;
		uint32_t psn = 100u * c + 1;

		if (c == E_MR_NO_RW || c == E_READ_NO_RR) {
			mr2 = ibv_reg_mr(s.ep.pd, s.buf, 4096, c == E_MR_NO_RW ?
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ :
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			T_CHECK(mr2, "second MR");
			me.rkey = mr2->rkey;
			me.len = 4096;
		}
		if (c == E_QP_NO_RW)
			access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
		me.psn = psn;
		T_CHECK(t_send(fd, &me, sizeof(me)) == 0, "case address");
		/* PSN mismatch: expect a PSN the requester will not send. */
		s.peer.psn = 100u * c + (c == E_BAD_PSN ? 5u : 0u);
		rc = t_connect(&s.ep, &s.peer, psn, access, 8, 2, 7);
		T_CHECK(rc == 0, "reconnect: %s", strerror(rc));
		T_CHECK(barrier(fd) == 0, "connected");
		if (c == E_BAD_RKEY) {
			T_CHECK(t_post_recv(s.ep.qp, 11, NULL, 0, 0) == 0 &&
				t_post_recv(s.ep.qp, 12, NULL, 0, 0) == 0, "post_recv");
		} else if (c == E_SEND_TOO_LONG) {
			T_CHECK(t_post_recv(s.ep.qp, 13, s.buf, 16, s.mr->lkey) == 0, "post_recv");
		} else if (c == E_ZERO_LEN) {
			T_CHECK(t_post_recv(s.ep.qp, 14, NULL, 0, 0) == 0, "post_recv");
		}
		T_CHECK(t_send_u32(fd, 0xcafe) == 0, "ready");

		switch (c) {
		case E_BAD_RKEY:
			/* The responder of an access violation: receives
			 * flushed, QP in ERR, an async event. */
			if (expect_cqe(s.ep.rcq, 11, IBV_WC_WR_FLUSH_ERR) ||
			    expect_cqe(s.ep.rcq, 12, IBV_WC_WR_FLUSH_ERR) ||
			    async_event(s.ep.ctx, IBV_EVENT_QP_ACCESS_ERR, s.ep.qp))
				return 1;
			T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_ERR, "responder QP in ERR");
			break;
		case E_PAST_END:
		case E_BEFORE_START:
		case E_MR_NO_RW:
		case E_QP_NO_RW:
		case E_READ_NO_RR:
			if (async_event(s.ep.ctx, c == E_QP_NO_RW ? IBV_EVENT_QP_REQ_ERR :
					IBV_EVENT_QP_ACCESS_ERR, s.ep.qp))
				return 1;
			T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_ERR, "responder QP in ERR");
			break;
		case E_RNR_OK: {
			struct timespec ts = { 0, 20000000 };

			T_CHECK(t_recv_u32(fd) == 1, "posted");
			/* Post the receive late: the requester is in RNR. */
			nanosleep(&ts, NULL);
			T_CHECK(t_post_recv(s.ep.qp, 15, NULL, 0, 0) == 0, "post_recv");
			T_CHECK(t_wait_cqe(s.ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
				wc.wr_id == 15 && ntohl(wc.imm_data) == 77 && wc.byte_len == 64,
				"late receive completes");
			T_CHECK(mismatches(s.buf, 77, 64) == 0, "RNR-retried payload");
			break;
		}
		case E_SEND_TOO_LONG:
			if (expect_cqe(s.ep.rcq, 13, IBV_WC_LOC_LEN_ERR))
				return 1;
			T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_ERR, "responder QP in ERR");
			break;
		case E_ZERO_LEN:
			T_CHECK(t_wait_cqe(s.ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
				wc.wr_id == 14 && wc.byte_len == 0 && ntohl(wc.imm_data) == 5,
				"0-byte write with imm");
			break;
		default:
			break;
		}
		T_CHECK(t_recv_u32(fd) == 0xd0e, "case end");
		/* Errors of the requester alone leave this QP working. */
		if (c == E_RNR_EXC || c == E_LOCAL_PROT || c == E_BAD_PSN || c == E_BAD_ADDR ||
		    c == E_ZERO_LEN || c == E_RNR_OK)
			T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_RTS, "responder QP still RTS");
		if (mr2) {
			T_CHECK(ibv_dereg_mr(mr2) == 0, "dereg");
			mr2 = NULL;
		}
		T_CHECK(t_send_u32(fd, 0xd0e) == 0, "case end");
	}
	teardown(&s);
	return 0;
}

/* ---- peerdeath ---------------------------------------------------------- */

static int death_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	int rc = setup(&s, fd, 9000, ALL_ACCESS), st;

	(void)arg;
	if (rc)
		return rc;
	fill(s.buf, 9, 4096);
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 1, s.buf, 4096, s.mr->lkey, s.peer.addr,
			     s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
	if (wait_ok(s.ep.scq, 1, IBV_WC_RDMA_WRITE))
		return 1;
	T_CHECK(t_recv_u32(fd) == 9, "responder saw the data");
	/* Kill the responder and do not reap it: a zombie must count as gone. */
	kill(child, SIGKILL);
	for (;;) {
		siginfo_t si;

		memset(&si, 0, sizeof(si));
		T_CHECK(waitid(P_PID, (id_t)child, &si, WEXITED | WNOHANG | WNOWAIT) == 0,
			"waitid");
		if (si.si_pid == child)
			break;
		sched_yield();
	}
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 2, s.buf, 4096, s.mr->lkey, s.peer.addr,
			     s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0 &&
		t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 3, s.buf, 8, s.mr->lkey,
			     s.peer.addr, s.peer.rkey, 3, IBV_SEND_SIGNALED) == 0, "post");
	if (expect_cqe(s.ep.scq, 2, IBV_WC_RETRY_EXC_ERR) ||
	    expect_cqe(s.ep.scq, 3, IBV_WC_WR_FLUSH_ERR))
		return 1;
	T_CHECK(t_qp_state(s.ep.qp) == IBV_QPS_ERR, "requester QP in ERR");
	t_log("killed responder: RETRY_EXC_ERR, then flush: ok");
	waitpid(child, &st, 0);
	teardown(&s);
	return 0;
}

static int death_child(int fd, void *arg)
{
	struct side s = { 0 };
	volatile unsigned char *p;
	int rc;

	(void)arg;
	rc = setup(&s, fd, 9500, ALL_ACCESS);
	if (rc)
		return rc;
	p = s.buf;
	while (mismatches(p, 9, 4096))
		;
	T_CHECK(t_send_u32(fd, 9) == 0, "seen");
	pause();  /* until killed */
	return 1;
}

/* ---- channel ------------------------------------------------------------ */

static int channel_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	uint32_t k;
	int rc = setup(&s, fd, 10000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	for (k = 1; k <= 10; k++) {
		fill(s.buf, k, 1000);
		T_CHECK(t_recv_u32(fd) == k, "armed");
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, s.buf, 1000,
				     s.mr->lkey, s.peer.addr, s.peer.rkey, k,
				     IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE))
			return 1;
	}
	/* Solicited-only arming: the unsolicited message must not wake. */
	T_CHECK(t_recv_u32(fd) == 100, "armed solicited");
	fill(s.buf, 100, 64);
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 100, s.buf, 64, s.mr->lkey,
			     s.peer.addr, s.peer.rkey, 100, IBV_SEND_SIGNALED) == 0, "post");
	if (wait_ok(s.ep.scq, 100, IBV_WC_RDMA_WRITE))
		return 1;
	T_CHECK(t_recv_u32(fd) == 100, "first delivered");
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_SEND_WITH_IMM, 101, s.buf, 64, s.mr->lkey, 0, 0, 101,
			     IBV_SEND_SIGNALED | IBV_SEND_SOLICITED) == 0, "post");
	if (wait_ok(s.ep.scq, 101, IBV_WC_SEND) || barrier(fd))
		return 1;
	teardown(&s);
	return 0;
}

static int channel_child(int fd, void *arg)
{
	struct side s = { 0 };
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *evcq;
	struct pollfd pfd;
	struct ibv_wc wc;
	void *evctx;
	int marker, rc, i;
	uint32_t k;

	(void)arg;
	rc = t_open(&s.ep);
	if (rc)
		return rc;
	/* Replace the receive CQ by one bound to a completion channel. */
	ch = ibv_create_comp_channel(s.ep.ctx);
	T_CHECK(ch, "ibv_create_comp_channel");
	ibv_destroy_cq(s.ep.rcq);
	s.ep.rcq = cq = ibv_create_cq(s.ep.ctx, 64, &marker, ch, 0);
	T_CHECK(cq, "ibv_create_cq with channel");
	s.buf = aligned_alloc(4096, BUFSZ);
	T_CHECK(s.buf, "allocation");
	memset(s.buf, 0, BUFSZ);
	s.mr = ibv_reg_mr(s.ep.pd, s.buf, BUFSZ, ALL_ACCESS);
	T_CHECK(s.mr && t_create_qp(&s.ep, 64, 64, NULL) == 0, "MR and QP");
	t_local_addr(&s.ep, 11000, &s.me);
	s.me.addr = (uintptr_t)s.buf;
	s.me.rkey = s.mr->rkey;
	T_CHECK(t_send(fd, &s.me, sizeof(s.me)) == 0 && t_recv(fd, &s.peer, sizeof(s.peer)) == 0,
		"exchange");
	T_CHECK(t_connect(&s.ep, &s.peer, 11000, ALL_ACCESS, 12, 3, 7) == 0, "connect");
	T_CHECK(t_send_u32(fd, 1) == 0 && t_recv_u32(fd) == 1, "barrier");
	pfd.fd = ch->fd;
	pfd.events = POLLIN;
	for (k = 1; k <= 10; k++) {
		T_CHECK(ibv_req_notify_cq(cq, 0) == 0, "arm");
		T_CHECK(t_post_recv(s.ep.qp, k, s.buf + SEND_OFF, 4096, s.mr->lkey) == 0, "recv");
		T_CHECK(t_send_u32(fd, k) == 0, "armed");
		T_CHECK(poll(&pfd, 1, 20000) == 1, "channel readable");
		T_CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq && evctx == &marker,
			"ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
		T_CHECK(t_wait_cqe(cq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == k &&
			ntohl(wc.imm_data) == k, "completion behind event %u", k);
		T_CHECK(mismatches(s.buf, k, 1000) == 0, "payload %u", k);
	}
	for (i = 0; i < 2; i++)
		T_CHECK(t_post_recv(s.ep.qp, 100 + (uint64_t)i, s.buf + SEND_OFF, 4096,
				    s.mr->lkey) == 0, "recv");
	T_CHECK(ibv_req_notify_cq(cq, 1) == 0, "arm solicited");
	T_CHECK(t_send_u32(fd, 100) == 0, "armed");
	T_CHECK(t_wait_cqe(cq, &wc) == 0 && wc.wr_id == 100, "unsolicited delivered");
	T_CHECK(poll(&pfd, 1, 0) == 0, "an unsolicited completion raised an event");
	T_CHECK(t_send_u32(fd, 100) == 0, "first delivered");
	T_CHECK(poll(&pfd, 1, 20000) == 1, "solicited completion raised no event");
	T_CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq, "event");
	ibv_ack_cq_events(cq, 1);
	T_CHECK(t_wait_cqe(cq, &wc) == 0 && wc.wr_id == 101 && wc.opcode == IBV_WC_RECV,
		"solicited send");
	T_CHECK(barrier(fd) == 0, "barrier");
	ibv_dereg_mr(s.mr);
	s.mr = NULL;
	ibv_destroy_qp(s.ep.qp);
	s.ep.qp = NULL;
	ibv_destroy_cq(cq);
	s.ep.rcq = NULL;
	T_CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
	teardown(&s);
	return 0;
}

/* ---- srq: two requesters, one SRQ, one CQ ------------------------------- */

#define SRQ_MSGS 64
#define SRQ_BATCH 8
#define SRQ_SLOT 256

static int srq_sender(int fd, void *arg)
{
	uint32_t id = (uint32_t)(uintptr_t)arg, k;
	struct side s = { 0 };
	int rc = setup(&s, fd, 12000 + id, ALL_ACCESS);

	if (rc)
		return rc;
	for (k = 0; k < SRQ_MSGS; k++) {
		uint32_t tag = (id << 16) | k;
		unsigned char *src = s.buf + (k % 16) * SRQ_SLOT;

		fill(src, tag, SRQ_SLOT);
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, src, SRQ_SLOT,
				     s.mr->lkey, s.peer.addr + (k % 16) * SRQ_SLOT, s.peer.rkey,
				     tag, IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE))
			return 1;
		if (k % SRQ_BATCH == SRQ_BATCH - 1)
			T_CHECK(t_recv_u32(fd) == k, "batch verified");
	}
	T_CHECK(barrier(fd) == 0, "barrier");
	teardown(&s);
	return 0;
}

static int srq_test(void)
{
	struct ibv_srq_init_attr sa;
	struct ibv_srq_attr lim;
	struct ibv_srq *srq;
	struct t_ep ep;
	struct ibv_qp *qp[2];
	unsigned char *buf[2];
	struct ibv_mr *mr[2];
	int fds[2], i, rc, got[2] = { 0, 0 }, st;
	pid_t pid[2];

	for (i = 0; i < 2; i++) {
		int sv[2];

		T_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
		fflush(NULL);
		pid[i] = fork();
		T_CHECK(pid[i] >= 0, "fork");
		if (pid[i] == 0) {
			close(sv[0]);
			if (i)
				close(fds[0]);
			t_role = i ? "sender2" : "sender1";
			_exit(srq_sender(sv[1], (void *)(uintptr_t)(i + 1)));
		}
		close(sv[1]);
		fds[i] = sv[0];
	}
	t_role = "responder";
	rc = t_open(&ep);
	if (rc) {
		for (i = 0; i < 2; i++) {
			close(fds[i]);
			waitpid(pid[i], &st, 0);
		}
		return rc;
	}
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 32;
	sa.attr.max_sge = 1;
	srq = ibv_create_srq(ep.pd, &sa);
	T_CHECK(srq, "ibv_create_srq: %s", strerror(errno));
	for (i = 0; i < 2; i++) {
		struct t_addr me, peer;

		buf[i] = aligned_alloc(4096, BUFSZ);
		T_CHECK(buf[i], "allocation");
		memset(buf[i], 0, BUFSZ);
		mr[i] = ibv_reg_mr(ep.pd, buf[i], BUFSZ, ALL_ACCESS);
		T_CHECK(mr[i], "ibv_reg_mr");
		ep.qp = NULL;
		T_CHECK(t_create_qp(&ep, 16, 0, srq) == 0, "QP on the SRQ");
		qp[i] = ep.qp;
		t_local_addr(&ep, 13000, &me);
		me.addr = (uintptr_t)buf[i];
		me.rkey = mr[i]->rkey;
		T_CHECK(t_send(fds[i], &me, sizeof(me)) == 0 &&
			t_recv(fds[i], &peer, sizeof(peer)) == 0, "exchange");
		T_CHECK(t_connect(&ep, &peer, 13000, ALL_ACCESS, 12, 3, 7) == 0, "connect");
	}
	for (i = 0; i < 16; i++) {
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i }, *bad;

		T_CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "ibv_post_srq_recv");
	}
	/* Armed at the current fill: the first arrival crosses it. */
	lim.srq_limit = 16;
	T_CHECK(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0, "arm the SRQ limit");
	for (i = 0; i < 2; i++)
		T_CHECK(t_send_u32(fds[i], 1) == 0 && t_recv_u32(fds[i]) == 1, "barrier");

	while (got[0] + got[1] < 2 * SRQ_MSGS) {
		struct ibv_recv_wr wr = { .wr_id = 99 }, *bad;
		struct ibv_wc wc;
		uint32_t tag, who, k;

		T_CHECK(t_wait_cqe(ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS,
			"receive: %s", ibv_wc_status_str(wc.status));
		T_CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "replenish");
		tag = ntohl(wc.imm_data);
		who = (tag >> 16) - 1;
		k = tag & 0xffff;
		T_CHECK(who < 2 && wc.qp_num == qp[who]->qp_num,
			"completion on QP %u for sender %u", wc.qp_num, who + 1);
		T_CHECK(k == (uint32_t)got[who], "sender %u: message %u out of order (want %d)",
			who + 1, k, got[who]);
		T_CHECK(mismatches(buf[who] + (k % 16) * SRQ_SLOT, tag, SRQ_SLOT) == 0,
			"sender %u message %u payload", who + 1, k);
		got[who]++;
		if (k % SRQ_BATCH == SRQ_BATCH - 1)
			T_CHECK(t_send_u32(fds[who], k) == 0, "batch verified");
	}
	/* The armed limit fired (once). */
	if (async_event(ep.ctx, IBV_EVENT_SRQ_LIMIT_REACHED, NULL))
		return 1;
	t_log("%d + %d messages through one SRQ and one CQ: ok", got[0], got[1]);
	for (i = 0; i < 2; i++) {
		T_CHECK(t_send_u32(fds[i], 0xba) == 0 && t_recv_u32(fds[i]) == 0xba, "barrier");
		T_CHECK(ibv_destroy_qp(qp[i]) == 0 && ibv_dereg_mr(mr[i]) == 0, "teardown");
		free(buf[i]);
	}
	T_CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	ep.qp = NULL;
	t_close(&ep);
	for (i = 0; i < 2; i++) {
		close(fds[i]);
		T_CHECK(waitpid(pid[i], &st, 0) == pid[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			"sender %d failed", i + 1);
	}
	return 0;
}

/* ---- twonode: two simulated hosts --------------------------------------- */

static int twonode_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	struct t_addr bad;
	uint32_t k;
	int rc = setup(&s, fd, 14000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	if (t_under_sim())
		T_CHECK(s.ep.roce ? memcmp(s.me.gid, s.peer.gid, 16) != 0 : s.me.lid != s.peer.lid,
			"the two hosts share an address");
	for (k = 1; k <= 5; k++) {
		fill(s.buf, k, 8192);
		T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, k, s.buf, 8192,
				     s.mr->lkey, s.peer.addr, s.peer.rkey, k,
				     IBV_SEND_SIGNALED) == 0, "post");
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != k)
			return 1;
	}
	/* Addressed to a host that does not exist: a transport error. */
	bad = s.peer;
	bad.lid = (uint16_t)(s.peer.lid + 7);
	bad.gid[15] ^= 0x7;
	T_CHECK(t_connect(&s.ep, &bad, 14000 + 5, ALL_ACCESS, 8, 1, 7) == 0, "misaddress");
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE, 9, s.buf, 8, s.mr->lkey, s.peer.addr,
			     s.peer.rkey, 0, IBV_SEND_SIGNALED) == 0, "post");
	if (expect_cqe(s.ep.scq, 9, IBV_WC_RETRY_EXC_ERR))
		return 1;
	/* Recover as real code must: both sides reset and reconnect. */
	T_CHECK(t_send_u32(fd, 0x5e7) == 0, "reconnect request");
	s.peer.psn = 15100;
	T_CHECK(t_connect(&s.ep, &s.peer, 14100, ALL_ACCESS, 12, 3, 7) == 0, "reconnect");
	T_CHECK(barrier(fd) == 0, "barrier");
	fill(s.buf, 6, 8192);
	T_CHECK(t_post_write(s.ep.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 6, s.buf, 8192, s.mr->lkey,
			     s.peer.addr, s.peer.rkey, 6, IBV_SEND_SIGNALED) == 0, "post");
	if (wait_ok(s.ep.scq, 6, IBV_WC_RDMA_WRITE) || t_recv_u32(fd) != 6)
		return 1;
	t_log("two hosts (%s %u -> %u): ok", s.ep.roce ? "GID ending" : "LID",
	      s.ep.roce ? s.me.gid[15] : s.me.lid, s.ep.roce ? s.peer.gid[15] : s.peer.lid);
	teardown(&s);
	return 0;
}

static int twonode_child(int fd, void *arg)
{
	struct side s = { 0 };
	uint32_t k;
	int rc, i;

	(void)arg;
	/* Another simulated host: set before the library reads it. */
	setenv("DCHAN_VSIM_NODE", "1", 1);
	rc = setup(&s, fd, 15000, ALL_ACCESS);
	if (rc)
		return rc;
	for (i = 0; i < 8; i++)
		T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0, "post_recv");
	for (k = 1; k <= 6; k++) {
		struct ibv_wc wc;

		if (k == 6) {
			/* The requester failed and resets: reconnect, and
			 * repost receives (a reset empties the queue). */
			T_CHECK(t_recv_u32(fd) == 0x5e7, "reconnect request");
			s.peer.psn = 14100;
			T_CHECK(t_connect(&s.ep, &s.peer, 15100, ALL_ACCESS, 12, 3, 7) == 0,
				"reconnect");
			T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0, "post_recv");
			T_CHECK(barrier(fd) == 0, "barrier");
		}
		T_CHECK(t_wait_cqe(s.ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
			ntohl(wc.imm_data) == k, "receive %u", k);
		T_CHECK(mismatches(s.buf, k, 8192) == 0, "payload %u", k);
		T_CHECK(t_send_u32(fd, k) == 0, "ack");
	}
	teardown(&s);
	return 0;
}

/* ---- wholeword: the final word comes from the responder's process ------- */

/*
 * The kernel's byte copy (process_vm_writev) can be seen half done in an
 * aligned word; the simulation promises what an HCA does, an aligned word
 * written whole, for the word a poller reads: the last one of a WRITE, which
 * the responder's own process stores. To tell who stored it, the responder
 * puts that word in memfd_secret() memory: its own loads and stores work
 * there, but no process_vm_writev can reach it (EFAULT). The body of every
 * message lies in the ordinary page before it. A simulation that copied the
 * final word by CMA fails each case (an error completion, or in "delayed" a
 * placement dropped); no timing is involved.
 */

struct ww_region {
	uint64_t addr;            /* the ordinary page; the secret one follows */
	uint32_t rkey;
	uint32_t ok;              /* 0: no memfd_secret here, nothing checked */
};

/* One case: 'len' bytes ending at the start of the secret page + 'end', from
 * up to two SGEs (the second 'split' bytes long), inline or not. */
struct ww_case {
	enum ibv_wr_opcode op;
	size_t len, split;
	size_t end;
	int is_inline;
	const char *what;
};

static const struct ww_case ww_cases[] = {
	{ IBV_WR_RDMA_WRITE, 64, 0, 8, 0, "64-byte WRITE" },
	{ IBV_WR_RDMA_WRITE_WITH_IMM, 4104, 0, 8, 0, "4104-byte WRITE WITH IMM" },
	{ IBV_WR_RDMA_WRITE, 8, 0, 24, 0, "8-byte WRITE (a flag)" },
	{ IBV_WR_RDMA_WRITE, 66, 5, 8, 0, "2-SGE WRITE, final word across the SGEs" },
	{ IBV_WR_RDMA_WRITE, 24, 0, 8, 1, "inline WRITE" },
	{ IBV_WR_RDMA_WRITE_WITH_IMM, 8, 0, 40, 0, "8-byte WRITE WITH IMM" },
};
#define WW_N (sizeof(ww_cases) / sizeof(ww_cases[0]))

static int wholeword_parent(int fd, pid_t child, void *arg)
{
	struct side s = { 0 };
	struct ww_region r;
	long pg = sysconf(_SC_PAGESIZE);
	uint32_t k;
	int rc = setup(&s, fd, 16000, ALL_ACCESS);

	(void)child, (void)arg;
	if (rc)
		return rc;
	T_CHECK(t_recv(fd, &r, sizeof(r)) == 0, "region");
	if (!r.ok) {
		/* vsim-run.sh reports the test skipped, naming why. */
		t_log("SKIP: memfd_secret is not usable here: the hand-off cannot be told "
		      "from a copy");
		teardown(&s);
		return T_SKIP;
	}
	for (k = 1; k <= WW_N; k++) {
		const struct ww_case *c = &ww_cases[k - 1];
		uint64_t raddr = r.addr + (uint64_t)pg + c->end - c->len;
		unsigned char *src = s.buf + 61;  /* not 8-aligned in the source */
		struct ibv_sge sg[2];
		struct ibv_send_wr w, *bad;

		fill(src, k, c->len);
		memset(&w, 0, sizeof(w));
		w.wr_id = k;
		w.opcode = c->op;
		w.sg_list = sg;
		w.num_sge = c->split ? 2 : 1;
		w.send_flags = IBV_SEND_SIGNALED | (c->is_inline ? IBV_SEND_INLINE : 0);
		w.imm_data = htonl(k);
		w.wr.rdma.remote_addr = raddr;
		w.wr.rdma.rkey = r.rkey;
		sg[0].addr = (uintptr_t)src;
		sg[0].length = (uint32_t)(c->len - c->split);
		sg[0].lkey = s.mr->lkey;
		if (c->split) {
			/* The second SGE elsewhere, so the word is gathered. */
			memcpy(s.buf + READ_OFF, src + c->len - c->split, c->split);
			sg[1].addr = (uintptr_t)(s.buf + READ_OFF);
			sg[1].length = (uint32_t)c->split;
			sg[1].lkey = s.mr->lkey;
		}
		T_CHECK(ibv_post_send(s.ep.qp, &w, &bad) == 0, "post %s", c->what);
		if (wait_ok(s.ep.scq, k, IBV_WC_RDMA_WRITE))
			return 1;
		T_CHECK(t_send_u32(fd, k) == 0 && t_recv_u32(fd) == k, "%s: the responder "
			"did not find it in place", c->what);
		t_log("%s, final word in memory CMA cannot write: ok", c->what);
	}
	T_CHECK(barrier(fd) == 0, "barrier");
	teardown(&s);
	return 0;
}

/* Two pages: an ordinary one, then one of memfd_secret() memory. */
static unsigned char *ww_map(long pg)
{
	unsigned char *p, probe[8] = { 0 };
	struct iovec l = { probe, 8 }, rv;
	int sfd;

	p = mmap(NULL, (size_t)(2 * pg), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (p == MAP_FAILED)
		return NULL;
#ifdef SYS_memfd_secret
	sfd = (int)syscall(SYS_memfd_secret, 0);
#else
	sfd = -1;
	errno = ENOSYS;
#endif
	if (sfd < 0) {
		t_log("memfd_secret: %s", strerror(errno));
		goto fail;
	}
	if (ftruncate(sfd, pg) ||
	    mmap(p + pg, (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, sfd, 0) ==
	    MAP_FAILED) {
		t_log("memfd_secret memory: %s", strerror(errno));
		close(sfd);
		goto fail;
	}
	close(sfd);
	/* The premise: the kernel's copy cannot reach it. */
	rv.iov_base = p + pg;
	rv.iov_len = 8;
	if (process_vm_writev(getpid(), &l, 1, &rv, 1, 0) != -1 || errno != EFAULT) {
		t_log("process_vm_writev reaches memfd_secret memory here");
		goto fail;
	}
	return p;
fail:
	munmap(p, (size_t)(2 * pg));
	return NULL;
}

static int wholeword_child(int fd, void *arg)
{
	struct side s = { 0 };
	struct ww_region r = { 0, 0, 0 };
	struct ibv_mr *mr = NULL;
	long pg = sysconf(_SC_PAGESIZE);
	unsigned char *reg, want[4200];
	uint32_t k;
	int rc = setup(&s, fd, 17000, ALL_ACCESS), i;

	(void)arg;
	if (rc)
		return rc;
	for (i = 0; i < 8; i++)
		T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0, "post_recv");
	reg = ww_map(pg);
	if (reg) {
		memset(reg, 0, (size_t)(2 * pg));
		mr = ibv_reg_mr(s.ep.pd, reg, (size_t)(2 * pg), ALL_ACCESS);
		T_CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
		r.addr = (uintptr_t)reg;
		r.rkey = mr->rkey;
		r.ok = 1;
	}
	T_CHECK(t_send(fd, &r, sizeof(r)) == 0, "region");
	for (k = 1; r.ok && k <= WW_N; k++) {
		const struct ww_case *c = &ww_cases[k - 1];
		unsigned char *at = reg + pg + c->end - c->len;
		struct ibv_wc wc;

		fill(want, k, c->len);
		T_CHECK(t_recv_u32(fd) == k, "the requester failed %s", c->what);
		if (c->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
			/* The data is all there at the completion. */
			T_CHECK(t_wait_cqe(s.ep.rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
				ntohl(wc.imm_data) == k, "%s: receive completion", c->what);
			T_CHECK(t_post_recv(s.ep.qp, 0, NULL, 0, 0) == 0, "repost");
			T_CHECK(memcmp(at, want, c->len) == 0, "%s: wrong at the completion",
				c->what);
		} else {
			/* Under "delayed" it lands after the send completion. */
			T_CHECK(t_wait_bytes(at, want, c->len) == 0, "%s: never arrived whole",
				c->what);
		}
		T_CHECK(t_send_u32(fd, k) == 0, "ack");
	}
	/* (A requester told there is no region skips the barrier.) */
	T_CHECK(!r.ok || barrier(fd) == 0, "barrier");
	if (mr)
		ibv_dereg_mr(mr);
	if (reg)
		munmap(reg, (size_t)(2 * pg));
	teardown(&s);
	return r.ok ? 0 : T_SKIP;
}

/* ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	const char *sc = argc > 1 ? argv[1] : "";
	int i;

	for (i = 2; i + 1 < argc; i++)
		if (!strcmp(argv[i], "--expect"))
			expect = argv[++i];
	t_log("libibverbs: %s", t_libibverbs_path());
	if (getenv("VSIM_TEST_EXPECT_SIM") && *getenv("VSIM_TEST_EXPECT_SIM") == '1' &&
	    !t_under_sim()) {
		t_log("FAIL: expected the simulation");
		return 1;
	}
	if (!strcmp(sc, "write"))
		return t_fork2(write_parent, write_child, NULL);
	if (!strcmp(sc, "lastbyte"))
		return t_fork2(lastbyte_parent, lastbyte_child, NULL);
	if (!strcmp(sc, "late"))
		return t_fork2(late_parent, late_child, NULL);
	if (!strcmp(sc, "errors"))
		return t_fork2(errors_parent, errors_child, NULL);
	if (!strcmp(sc, "peerdeath"))
		return t_fork2(death_parent, death_child, NULL);
	if (!strcmp(sc, "channel"))
		return t_fork2(channel_parent, channel_child, NULL);
	if (!strcmp(sc, "srq"))
		return srq_test();
	if (!strcmp(sc, "twonode"))
		return t_fork2(twonode_parent, twonode_child, NULL);
	if (!strcmp(sc, "wholeword"))
		return t_fork2(wholeword_parent, wholeword_child, NULL);
	fprintf(stderr, "usage: %s write|lastbyte|late|errors|peerdeath|channel|srq|twonode|"
		"wholeword [--expect broken|intact|late|ontime]\n", argv[0]);
	return 2;
}
