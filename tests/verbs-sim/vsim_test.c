/* SPDX-License-Identifier: BSD-3-Clause */
#define _GNU_SOURCE
#include "vsim_test.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *t_role = "main";

void t_fail(const char *file, int line, const char *cond)
{
	fprintf(stderr, "[%s %d] FAIL %s:%d: %s\n", t_role, (int)getpid(), file, line, cond);
}

void t_log(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%s] ", t_role);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
}

const char *t_libibverbs_path(void)
{
	static char path[4096];
	Dl_info info;

	if (!dladdr((void *)ibv_get_device_list, &info) || !info.dli_fname)
		return "unknown";
	snprintf(path, sizeof(path), "%s", info.dli_fname);
	return path;
}

int t_under_sim(void)
{
	return strstr(t_libibverbs_path(), "verbs-sim") != NULL;
}

int t_open(struct t_ep *ep)
{
	const char *want = getenv("VSIM_TEST_DEVICE");
	struct ibv_device **list;
	struct ibv_device *dev = NULL;
	int n = 0, i;

	memset(ep, 0, sizeof(*ep));
	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		t_log("no RDMA device (%s); libibverbs is %s",
		      list ? "empty list" : strerror(errno), t_libibverbs_path());
		if (list)
			ibv_free_device_list(list);
		return T_SKIP;
	}
	for (i = 0; i < n; i++)
		if (!want || !*want || !strcmp(want, "any") ||
		    !strcmp(ibv_get_device_name(list[i]), want)) {
			dev = list[i];
			break;
		}
	if (!dev) {
		t_log("device %s not found", want);
		ibv_free_device_list(list);
		return T_SKIP;
	}
	ep->ctx = ibv_open_device(dev);
	ibv_free_device_list(list);
	T_CHECK(ep->ctx, "ibv_open_device: %s", strerror(errno));
	T_CHECK(ibv_query_port(ep->ctx, 1, &ep->port) == 0, "ibv_query_port");
	T_CHECK(ep->port.state == IBV_PORT_ACTIVE, "port 1 not active");
	ep->roce = ep->port.link_layer == IBV_LINK_LAYER_ETHERNET;
	/* RoCE: use the last valid GID (the IPv4-mapped one on the sim). */
	ep->gid_index = 0;
	if (ep->roce) {
		for (i = ep->port.gid_tbl_len - 1; i >= 0; i--) {
			union ibv_gid g;

			if (ibv_query_gid(ep->ctx, 1, i, &g) == 0 &&
			    (g.global.subnet_prefix || g.global.interface_id)) {
				ep->gid_index = i;
				break;
			}
		}
	}
	T_CHECK(ibv_query_gid(ep->ctx, 1, ep->gid_index, &ep->gid) == 0, "ibv_query_gid");
	ep->pd = ibv_alloc_pd(ep->ctx);
	T_CHECK(ep->pd, "ibv_alloc_pd");
	ep->scq = ibv_create_cq(ep->ctx, 1024, NULL, NULL, 0);
	ep->rcq = ibv_create_cq(ep->ctx, 1024, NULL, NULL, 0);
	T_CHECK(ep->scq && ep->rcq, "ibv_create_cq: %s", strerror(errno));
	return 0;
}

void t_close(struct t_ep *ep)
{
	if (ep->qp)
		ibv_destroy_qp(ep->qp);
	if (ep->scq)
		ibv_destroy_cq(ep->scq);
	if (ep->rcq)
		ibv_destroy_cq(ep->rcq);
	if (ep->pd)
		ibv_dealloc_pd(ep->pd);
	if (ep->ctx)
		ibv_close_device(ep->ctx);
	memset(ep, 0, sizeof(*ep));
}

int t_create_qp(struct t_ep *ep, uint32_t max_send_wr, uint32_t max_recv_wr,
		struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.send_cq = ep->scq;
	a.recv_cq = ep->rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = srq ? 0 : max_recv_wr;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = srq ? 0 : 2;
	a.cap.max_inline_data = 64;
	ep->qp = ibv_create_qp(ep->pd, &a);
	T_CHECK(ep->qp, "ibv_create_qp: %s", strerror(errno));
	return 0;
}

void t_local_addr(const struct t_ep *ep, uint32_t psn, struct t_addr *a)
{
	memset(a, 0, sizeof(*a));
	a->qpn = ep->qp->qp_num;
	a->psn = psn;
	a->lid = ep->port.lid;
	memcpy(a->gid, ep->gid.raw, 16);
}

int t_reset(struct t_ep *ep)
{
	struct ibv_qp_attr at;

	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RESET;
	return ibv_modify_qp(ep->qp, &at, IBV_QP_STATE);
}

int t_connect(struct t_ep *ep, const struct t_addr *r, uint32_t my_psn, unsigned access,
	      uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry)
{
	struct ibv_qp_attr at;
	int rc;

	rc = t_reset(ep);
	if (rc)
		return rc;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.pkey_index = 0;
	at.port_num = 1;
	at.qp_access_flags = access;
	rc = ibv_modify_qp(ep->qp, &at,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;

	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = ep->port.active_mtu;
	at.dest_qp_num = r->qpn;
	at.rq_psn = r->psn;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 1;  /* 0.01 ms */
	at.ah_attr.port_num = 1;
	if (ep->roce) {
		/* Ethernet: address by GID, with a GRH. */
		at.ah_attr.is_global = 1;
		memcpy(at.ah_attr.grh.dgid.raw, r->gid, 16);
		at.ah_attr.grh.sgid_index = (uint8_t)ep->gid_index;
		at.ah_attr.grh.hop_limit = 64;
	} else {
		at.ah_attr.dlid = r->lid;
	}
	rc = ibv_modify_qp(ep->qp, &at,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;

	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.sq_psn = my_psn;
	at.timeout = timeout;
	at.retry_cnt = retry_cnt;
	at.rnr_retry = rnr_retry;
	at.max_rd_atomic = 1;
	return ibv_modify_qp(ep->qp, &at,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* How long a wait may take before it is a hang, as in tests/mp
 * (mpt_time_limit_ns): generous, for a loaded 2-core machine. */
#define T_WAIT_MS 120000

int t_wait_cqe(struct ibv_cq *cq, struct ibv_wc *wc)
{
	uint64_t deadline = now_ms() + T_WAIT_MS;
	unsigned spins = 0;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0) {
			t_log("ibv_poll_cq: %d", n);
			return -1;
		}
		if (n == 1)
			return 0;
		/* Yield now and then: two cores run several processes. */
		if (++spins % 1024 == 0) {
			if (now_ms() > deadline) {
				t_log("no completion within %d s", T_WAIT_MS / 1000);
				return -1;
			}
			sched_yield();
		}
	}
}

int t_wait_bytes(const volatile void *p, const void *want, size_t n)
{
	uint64_t deadline = now_ms() + T_WAIT_MS;

	while (memcmp((const void *)p, want, n)) {
		if (now_ms() > deadline) {
			t_log("data did not arrive within %d s", T_WAIT_MS / 1000);
			return -1;
		}
		sched_yield();
	}
	return 0;
}

int t_post_write(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *buf,
		 size_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm,
		 unsigned flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = op;
	wr.sg_list = len ? &sge : NULL;
	wr.num_sge = len ? 1 : 0;
	wr.send_flags = flags;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

int t_post_recv(struct ibv_qp *qp, uint64_t wr_id, void *buf, size_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = len ? &sge : NULL;
	wr.num_sge = len ? 1 : 0;
	return ibv_post_recv(qp, &wr, &bad);
}

int t_qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(qp, &at, IBV_QP_STATE, &init))
		return -1;
	return at.qp_state;
}

int t_send(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t k = write(fd, c, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

int t_recv(int fd, void *p, size_t n)
{
	char *c = p;

	while (n) {
		ssize_t k = read(fd, c, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

int t_send_u32(int fd, uint32_t v)
{
	return t_send(fd, &v, sizeof(v));
}

uint32_t t_recv_u32(int fd)
{
	uint32_t v = 0xffffffffu;

	if (t_recv(fd, &v, sizeof(v)))
		return 0xffffffffu;
	return v;
}

int t_fork2(int (*parent)(int fd, pid_t child, void *arg), int (*child)(int fd, void *arg),
	    void *arg)
{
	int sv[2], rc, st = 0;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		perror("socketpair");
		return 1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		close(sv[0]);
		t_role = "child";
		rc = child(sv[1], arg);
		fflush(NULL);
		_exit(rc);
	}
	close(sv[1]);
	t_role = "parent";
	rc = parent(sv[0], pid, arg);
	close(sv[0]);
	/* The parent may have reaped (or killed) the child itself. */
	if (waitpid(pid, &st, 0) == pid) {
		if (WIFSIGNALED(st)) {
			t_log("child died of signal %d", WTERMSIG(st));
			return 1;
		}
		if (rc == T_SKIP && WEXITSTATUS(st) == T_SKIP)
			return T_SKIP;
		if (rc == 0 && WEXITSTATUS(st) != 0)
			rc = WEXITSTATUS(st) == T_SKIP ? 1 : WEXITSTATUS(st);
	}
	return rc == T_SKIP ? 1 : rc;
}
