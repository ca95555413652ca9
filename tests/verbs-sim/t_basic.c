/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One process: device and port queries, the inline (extended-context)
 * paths of verbs.h, every MR registration entry, the QP state machine and
 * its attribute masks, resource busy rules, send queue overflow, flushes,
 * data through a QP connected to itself, and a completion channel.
 *
 * Standard verbs only: against the real libibverbs with no device it
 * reports that and exits 77; on real hardware the checks hold as well.
 */
#define _GNU_SOURCE
#include "vsim_test.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF 65536

static int check_device(struct t_ep *ep)
{
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dx;
	struct ibv_gid_entry ge;
	const char *name = ibv_get_device_name(ep->ctx->device);
	const char *want = getenv("VSIM_TEST_DEVICE");

	T_CHECK(name && *name, "device name");
	T_CHECK(ibv_query_device(ep->ctx, &da) == 0, "ibv_query_device");
	T_CHECK(da.phys_port_cnt >= 1 && da.max_qp_wr > 0 && da.max_sge > 0 && da.max_cqe > 0,
		"device limits");
	/* Inline wrapper: through verbs_context.query_device_ex. */
	T_CHECK(ibv_query_device_ex(ep->ctx, NULL, &dx) == 0, "ibv_query_device_ex");
	T_CHECK(dx.orig_attr.phys_port_cnt == da.phys_port_cnt, "query_device_ex port count");
	T_CHECK(ep->port.max_msg_sz >= BUF, "max_msg_sz");
	if (ep->roce) {
		T_CHECK(ep->port.lid == 0, "RoCE port with a LID");
		T_CHECK(ibv_query_gid_ex(ep->ctx, 1, (uint32_t)ep->gid_index, &ge, 0) == 0,
			"ibv_query_gid_ex");
		T_CHECK(ge.gid_type == IBV_GID_TYPE_ROCE_V1 || ge.gid_type == IBV_GID_TYPE_ROCE_V2,
			"RoCE GID type %u", ge.gid_type);
	} else {
		T_CHECK(ep->port.lid != 0, "InfiniBand port without a LID");
	}
	if (t_under_sim() && want && !strcmp(want, "vsim_ib0"))
		T_CHECK(ep->port.link_layer == IBV_LINK_LAYER_INFINIBAND, "vsim_ib0 link layer");
	if (t_under_sim() && want && !strcmp(want, "vsim_roce0"))
		T_CHECK(ep->port.link_layer == IBV_LINK_LAYER_ETHERNET, "vsim_roce0 link layer");
	T_CHECK(ep->ctx->async_fd >= 0, "async_fd");
	T_CHECK(strlen(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)) > 0, "ibv_wc_status_str");
	T_CHECK(strlen(ibv_port_state_str(IBV_PORT_ACTIVE)) > 0, "ibv_port_state_str");
	t_log("%s: link layer %s, lid %u, active mtu %d, gid index %d", name,
	      ep->roce ? "Ethernet" : "InfiniBand", ep->port.lid, 128 << ep->port.active_mtu,
	      ep->gid_index);
	return 0;
}

static int check_mr(struct t_ep *ep, char *buf)
{
	/* The compiler decides between ibv_reg_mr, ibv_reg_mr_iova and
	 * ibv_reg_mr_iova2 from the flags: exercise all three. */
	volatile unsigned runtime = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *a, *b, *c, *d;

	a = ibv_reg_mr(ep->pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	b = ibv_reg_mr(ep->pd, buf, BUF, runtime);
	c = ibv_reg_mr(ep->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	d = ibv_reg_mr_iova(ep->pd, buf, 4096, 0x100000, IBV_ACCESS_LOCAL_WRITE);
	T_CHECK(a && b && c && d, "ibv_reg_mr variants: %s", strerror(errno));
	T_CHECK(a->addr == buf && a->length == BUF && a->pd == ep->pd, "MR fields");
	T_CHECK(a->lkey != b->lkey, "distinct keys");
	errno = 0;
	T_CHECK(!ibv_reg_mr(ep->pd, buf, BUF, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
		"remote write without local write must fail with EINVAL");
	T_CHECK(ibv_dealloc_pd(ep->pd) == EBUSY, "dealloc_pd with MRs must be EBUSY");
	T_CHECK(!ibv_dereg_mr(a) && !ibv_dereg_mr(b) && !ibv_dereg_mr(c) && !ibv_dereg_mr(d),
		"ibv_dereg_mr");
	return 0;
}

static int modify(struct ibv_qp *qp, enum ibv_qp_state st, int mask, struct ibv_qp_attr *at)
{
	at->qp_state = st;
	return ibv_modify_qp(qp, at, mask | IBV_QP_STATE);
}

static int check_states(struct t_ep *ep, char *buf, struct ibv_mr *mr)
{
	struct ibv_send_wr wr, *bad = NULL;
	struct ibv_qp_attr at;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };

	T_CHECK(t_qp_state(ep->qp) == IBV_QPS_RESET, "new QP is in RESET");
	memset(&at, 0, sizeof(at));
	at.port_num = 1;
	at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	T_CHECK(modify(ep->qp, IBV_QPS_RTR, 0, &at) != 0, "RESET->RTR must fail");
	T_CHECK(modify(ep->qp, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT, &at) != 0,
		"RESET->INIT without IBV_QP_ACCESS_FLAGS must fail");
	T_CHECK(modify(ep->qp, IBV_QPS_INIT,
		       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &at) == 0,
		"RESET->INIT");
	T_CHECK(t_qp_state(ep->qp) == IBV_QPS_INIT && ep->qp->state == IBV_QPS_INIT, "INIT");

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	T_CHECK(ibv_post_send(ep->qp, &wr, &bad) != 0 && bad == &wr,
		"post_send in INIT must fail at once");

	memset(&at, 0, sizeof(at));
	at.sq_psn = 1;
	T_CHECK(modify(ep->qp, IBV_QPS_RTS, IBV_QP_SQ_PSN, &at) != 0, "INIT->RTS must fail");
	memset(&at, 0, sizeof(at));
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = ep->qp->qp_num;
	at.ah_attr.port_num = 1;
	at.ah_attr.dlid = ep->port.lid;
	if (ep->roce) {
		at.ah_attr.is_global = 1;
		at.ah_attr.grh.dgid = ep->gid;
		at.ah_attr.grh.sgid_index = (uint8_t)ep->gid_index;
	}
	T_CHECK(modify(ep->qp, IBV_QPS_RTR,
		       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC, &at) != 0,
		"INIT->RTR without IBV_QP_MIN_RNR_TIMER must fail");
	if (ep->roce) {
		at.ah_attr.is_global = 0;
		T_CHECK(modify(ep->qp, IBV_QPS_RTR,
			       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, &at) != 0,
			"RoCE RTR without a GRH must fail");
	}
	T_CHECK(t_qp_state(ep->qp) == IBV_QPS_INIT, "failed modifies leave INIT");
	return 0;
}

/* A QP connected to itself moves data within this process. */
static int check_loopback(struct t_ep *ep, char *buf, struct ibv_mr *mr)
{
	struct t_addr me;
	struct ibv_wc wc;
	size_t i;

	t_local_addr(ep, 100, &me);
	me.addr = (uintptr_t)buf;
	T_CHECK(t_connect(ep, &me, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ, 14, 7, 7) == 0, "connect to itself");
	T_CHECK(t_qp_state(ep->qp) == IBV_QPS_RTS, "RTS");
	T_CHECK(ibv_destroy_cq(ep->scq) == EBUSY, "destroy_cq of a used CQ must be EBUSY");

	for (i = 0; i < 4096; i++)
		buf[i] = (char)t_pattern(1, i);
	memset(buf + 4096, 0, 4096);
	T_CHECK(t_post_recv(ep->qp, 7, NULL, 0, 0) == 0, "post_recv");
	T_CHECK(t_post_write(ep->qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, buf, 4096, mr->lkey,
			     (uintptr_t)buf + 4096, mr->rkey, 0xabcdef, IBV_SEND_SIGNALED) == 0,
		"post write with imm");
	T_CHECK(t_wait_cqe(ep->scq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
		wc.wr_id == 1 && wc.opcode == IBV_WC_RDMA_WRITE, "send CQE: %s",
		ibv_wc_status_str(wc.status));
	T_CHECK(t_wait_cqe(ep->rcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
		wc.wr_id == 7 && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
		(wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcdef &&
		wc.byte_len == 4096 && wc.qp_num == ep->qp->qp_num &&
		wc.src_qp == ep->qp->qp_num, "recv CQE");
	T_CHECK(!memcmp(buf, buf + 4096, 4096), "loopback payload");

	memset(buf + 8192, 0, 4096);
	T_CHECK(t_post_write(ep->qp, IBV_WR_RDMA_READ, 2, buf + 8192, 4096, mr->lkey,
			     (uintptr_t)buf, mr->rkey, 0, IBV_SEND_SIGNALED) == 0, "post read");
	T_CHECK(t_wait_cqe(ep->scq, &wc) == 0 && wc.status == IBV_WC_SUCCESS &&
		wc.opcode == IBV_WC_RDMA_READ, "read CQE");
	T_CHECK(!memcmp(buf, buf + 8192, 4096), "read payload");

	/* Inline data may be changed as soon as post_send returns. */
	memcpy(buf + 12288, "inline-data-1234", 16);
	T_CHECK(t_post_write(ep->qp, IBV_WR_RDMA_WRITE, 3, buf + 12288, 16, 0,
			     (uintptr_t)buf + 16384, mr->rkey, 0,
			     IBV_SEND_SIGNALED | IBV_SEND_INLINE) == 0, "post inline");
	memset(buf + 12288, 'x', 16);
	T_CHECK(t_wait_cqe(ep->scq, &wc) == 0 && wc.status == IBV_WC_SUCCESS, "inline CQE");
	/* A requester's completion does not promise the data is visible at
	 * the target yet (it is not under DCHAN_VSIM_PLACEMENT=delayed):
	 * only that it will be. */
	T_CHECK(t_wait_bytes(buf + 16384, "inline-data-1234", 16) == 0, "inline payload");
	return 0;
}

/* Unsignaled WRs hold their slots until a later signaled CQE is polled. */
static int check_overflow(struct t_ep *ep, char *buf, struct ibv_mr *mr)
{
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr init;
	struct ibv_wc wc;
	uint32_t n, i;
	int rc = 0;

	T_CHECK(ibv_query_qp(ep->qp, &at, IBV_QP_CAP, &init) == 0, "query_qp");
	n = init.cap.max_send_wr;
	for (i = 0; i < n && !rc; i++)
		rc = t_post_write(ep->qp, IBV_WR_RDMA_WRITE, 100 + i, buf, 8, mr->lkey,
				  (uintptr_t)buf + 32768, mr->rkey, 0, 0);
	T_CHECK(rc == 0, "posting %u unsignaled WRs", n);
	rc = t_post_write(ep->qp, IBV_WR_RDMA_WRITE, 999, buf, 8, mr->lkey,
			  (uintptr_t)buf + 32768, mr->rkey, 0, IBV_SEND_SIGNALED);
	T_CHECK(rc == ENOMEM, "WR %u on a full send queue must fail with ENOMEM (got %d)", n + 1,
		rc);

	/* ERR flushes; RESET empties the queue; the QP is usable again. */
	memset(&at, 0, sizeof(at));
	T_CHECK(modify(ep->qp, IBV_QPS_ERR, 0, &at) == 0, "->ERR");
	T_CHECK(t_qp_state(ep->qp) == IBV_QPS_ERR, "ERR");
	T_CHECK(modify(ep->qp, IBV_QPS_RTS, 0, &at) != 0, "ERR->RTS must fail");
	while (ibv_poll_cq(ep->scq, 1, &wc) > 0)
		;
	T_CHECK(t_post_recv(ep->qp, 55, NULL, 0, 0) == 0, "post_recv in ERR is accepted");
	T_CHECK(t_wait_cqe(ep->rcq, &wc) == 0 && wc.wr_id == 55 &&
		wc.status == IBV_WC_WR_FLUSH_ERR, "recv in ERR completes flushed");
	T_CHECK(t_reset(ep) == 0, "->RESET");
	return 0;
}

static int check_flush(struct t_ep *ep, char *buf, struct ibv_mr *mr)
{
	struct t_addr me;
	struct ibv_qp_attr at;
	struct ibv_wc wc;

	t_local_addr(ep, 7, &me);
	T_CHECK(t_connect(ep, &me, 7, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			  14, 7, 7) == 0,
		"reconnect after reset");
	T_CHECK(t_post_recv(ep->qp, 21, buf, 64, mr->lkey) == 0 &&
		t_post_recv(ep->qp, 22, buf, 64, mr->lkey) == 0, "post recvs");
	memset(&at, 0, sizeof(at));
	T_CHECK(modify(ep->qp, IBV_QPS_ERR, 0, &at) == 0, "->ERR");
	T_CHECK(t_wait_cqe(ep->rcq, &wc) == 0 && wc.wr_id == 21 &&
		wc.status == IBV_WC_WR_FLUSH_ERR && wc.qp_num == ep->qp->qp_num,
		"first recv flushed");
	T_CHECK(t_wait_cqe(ep->rcq, &wc) == 0 && wc.wr_id == 22 &&
		wc.status == IBV_WC_WR_FLUSH_ERR, "second recv flushed");
	/* Flushed WRs complete even when unsignaled. */
	T_CHECK(t_post_write(ep->qp, IBV_WR_RDMA_WRITE, 31, buf, 8, mr->lkey, (uintptr_t)buf,
			     mr->rkey, 0, 0) == 0, "post_send in ERR is accepted");
	T_CHECK(t_wait_cqe(ep->scq, &wc) == 0 && wc.wr_id == 31 &&
		wc.status == IBV_WC_WR_FLUSH_ERR, "send in ERR completes flushed: %s",
		ibv_wc_status_str(wc.status));
	T_CHECK(t_connect(ep, &me, 7, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			  14, 7, 7) == 0,
		"reset and reconnect");
	return 0;
}

static int check_in_order(struct t_ep *ep)
{
	const char *pl = getenv("DCHAN_VSIM_PLACEMENT");
	int v = ibv_query_qp_data_in_order(ep->qp, IBV_WR_RDMA_WRITE, 0);

	t_log("ibv_query_qp_data_in_order(RDMA_WRITE) = %d", v);
	T_CHECK(v == 0 || v == 1, "in-order answer %d", v);
	if (t_under_sim()) {
		int want = !pl || !*pl || !strcmp(pl, "inorder");

		T_CHECK(v == want, "placement %s must answer %d", pl ? pl : "(default)", want);
	}
	return 0;
}

static int check_channel(struct t_ep *ep, char *buf, struct ibv_mr *mr)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ep->ctx);
	struct ibv_cq *cq, *evcq = NULL;
	struct t_ep e2 = *ep;
	struct t_addr me;
	struct pollfd pfd;
	struct ibv_wc wc;
	void *evctx = NULL;

	T_CHECK(ch, "ibv_create_comp_channel: %s", strerror(errno));
	cq = ibv_create_cq(ep->ctx, 16, (void *)(uintptr_t)0x1234, ch, 0);
	T_CHECK(cq, "ibv_create_cq with a channel");
	T_CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "destroy of a used channel must be EBUSY");
	e2.rcq = cq;
	e2.qp = NULL;
	T_CHECK(t_create_qp(&e2, 8, 8, NULL) == 0, "second QP");
	t_local_addr(&e2, 3, &me);
	T_CHECK(t_connect(&e2, &me, 3, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			  14, 7, 7) == 0,
		"connect second QP to itself");
	T_CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	T_CHECK(t_post_recv(e2.qp, 5, NULL, 0, 0) == 0, "post_recv");
	T_CHECK(t_post_write(e2.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 6, buf, 8, mr->lkey,
			     (uintptr_t)buf + 40000, mr->rkey, 42, IBV_SEND_SIGNALED) == 0,
		"post write with imm");
	pfd.fd = ch->fd;
	pfd.events = POLLIN;
	T_CHECK(poll(&pfd, 1, 20000) == 1, "channel fd becomes readable");
	T_CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq &&
		evctx == (void *)(uintptr_t)0x1234, "ibv_get_cq_event");
	ibv_ack_cq_events(cq, 1);
	T_CHECK(t_wait_cqe(cq, &wc) == 0 && wc.wr_id == 5 && ntohl(wc.imm_data) == 42,
		"the completion behind the event");
	T_CHECK(t_wait_cqe(e2.scq, &wc) == 0 && wc.wr_id == 6, "send CQE");
	T_CHECK(ibv_destroy_qp(e2.qp) == 0 && ibv_destroy_cq(cq) == 0 &&
		ibv_destroy_comp_channel(ch) == 0, "teardown");
	return 0;
}

/*
 * The export table: default versions and compat twins resolve as in the
 * real library. Under the simulation the provider-private node is absent
 * and a call it does not emulate stops the process with a message.
 */
static int check_abi(struct t_ep *ep)
{
	struct ibv_ah_attr ah;
	pid_t pid;
	int st;

	T_CHECK(dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "IBVERBS_1.1") &&
		dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "IBVERBS_1.0") &&
		dlvsym(RTLD_DEFAULT, "ibv_reg_mr_iova2", "IBVERBS_1.8") &&
		dlvsym(RTLD_DEFAULT, "ibv_query_qp_data_in_order", "IBVERBS_1.14") &&
		dlvsym(RTLD_DEFAULT, "ibv_create_comp_channel", "IBVERBS_1.0"),
		"versioned exports");
	T_CHECK(dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "IBVERBS_1.0") !=
		dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "IBVERBS_1.1"), "compat twin is distinct");
	if (!t_under_sim())
		return 0;
	{
		/* The provider-private ABI is there, inert: a driver that a
		 * library links directly (libfabric links libefa) loads, and its
		 * registration is ignored, so no driver code ever runs. */
		void (*reg)(const void *) = (void (*)(const void *))dlvsym(
			RTLD_DEFAULT, "verbs_register_driver_34", "IBVERBS_PRIVATE_34");
		T_CHECK(reg != NULL, "the provider-private ABI is exported");
		reg(NULL);
		/* libefa needs IBVERBS_PRIVATE_34 symbols: it must load (where
		 * it is installed at all). */
		void *efa = dlopen("libefa.so.1", RTLD_NOW | RTLD_LOCAL);
		const char *e = efa ? "" : dlerror();
		T_CHECK(efa || !(strstr(e, "version") || strstr(e, "undefined symbol")),
			"libefa.so.1 does not load against the simulation: %s", e);
	}
	memset(&ah, 0, sizeof(ah));
	fflush(NULL);
	pid = fork();
	T_CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct rlimit no_core = { 0, 0 };

		setrlimit(RLIMIT_CORE, &no_core);  /* no core file in the build tree */
		ibv_create_ah(ep->pd, &ah);  /* UD only: not emulated */
		_exit(0);
	}
	T_CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
		"a call that is not emulated must abort");
	t_log("ABI: versions as in libibverbs, no private node, stubs abort: ok");
	return 0;
}

int main(void)
{
	const char *expect = getenv("VSIM_TEST_EXPECT_SIM");
	struct ibv_mr *mr;
	struct t_ep ep;
	char *buf;
	int rc;

	t_log("libibverbs: %s", t_libibverbs_path());
	if (expect && *expect == '1' && !t_under_sim()) {
		t_log("FAIL: expected the simulation, got %s", t_libibverbs_path());
		return 1;
	}
	if (expect && *expect == '0' && t_under_sim()) {
		t_log("FAIL: expected the real libibverbs");
		return 1;
	}
	rc = t_open(&ep);
	if (rc)
		return rc;
	buf = aligned_alloc(4096, BUF);
	T_CHECK(buf, "allocation");
	memset(buf, 0, BUF);
	if (check_device(&ep) || check_abi(&ep) || check_mr(&ep, buf))
		return 1;
	mr = ibv_reg_mr(ep.pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ);
	T_CHECK(mr, "ibv_reg_mr");
	if (t_create_qp(&ep, 4, 4, NULL) || check_states(&ep, buf, mr) ||
	    check_loopback(&ep, buf, mr) || check_in_order(&ep) ||
	    check_overflow(&ep, buf, mr) || check_flush(&ep, buf, mr) ||
	    check_channel(&ep, buf, mr))
		return 1;
	T_CHECK(ibv_dealloc_pd(ep.pd) == EBUSY, "dealloc_pd with a QP must be EBUSY");
	T_CHECK(ibv_destroy_qp(ep.qp) == 0, "ibv_destroy_qp");
	ep.qp = NULL;
	T_CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	t_close(&ep);
	free(buf);
	t_log("PASS");
	return 0;
}
