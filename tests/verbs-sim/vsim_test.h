/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers for the verbs-sim tests. The tests use only the public verbs API
 * and link with -libverbs, so the same binaries run against the simulation
 * (LD_LIBRARY_PATH), against the real libibverbs (no device here: they
 * report it and exit 77) and on real InfiniBand or RoCE hardware.
 */
#ifndef DCHAN_VSIM_TEST_H
#define DCHAN_VSIM_TEST_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define T_SKIP 77

/* Prints where and why, then makes the calling function return 1. */
#define T_CHECK(cond, ...)                                                   \
	do {                                                                 \
		if (!(cond)) {                                               \
			t_fail(__FILE__, __LINE__, #cond);                   \
			fprintf(stderr, "  " __VA_ARGS__);                   \
			fprintf(stderr, "\n");                               \
			return 1;                                            \
		}                                                            \
	} while (0)

void t_fail(const char *file, int line, const char *cond);
void t_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern const char *t_role;

/* One process's end of a connection. */
struct t_ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int gid_index;
	int roce;
};

/* What the peers exchange out of band, as real code would over TCP/PMIx. */
struct t_addr {
	uint32_t qpn;
	uint32_t psn;
	uint16_t lid;
	uint8_t gid[16];
	uint64_t addr;
	uint32_t rkey;
	uint64_t len;
};

/* Opens the device named by $VSIM_TEST_DEVICE (or the first one) and
 * allocates a PD and two CQs. Returns 0, T_SKIP without a device, or 1. */
int t_open(struct t_ep *ep);
void t_close(struct t_ep *ep);
int t_create_qp(struct t_ep *ep, uint32_t max_send_wr, uint32_t max_recv_wr,
		struct ibv_srq *srq);
void t_local_addr(const struct t_ep *ep, uint32_t psn, struct t_addr *a);
/* RESET -> INIT -> RTR -> RTS towards 'remote'. Returns 0 or an errno value. */
int t_connect(struct t_ep *ep, const struct t_addr *remote, uint32_t my_psn, unsigned access,
	      uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry);
int t_reset(struct t_ep *ep);
/* Waits for one completion (gives up after 20 s so a bug cannot hang). */
int t_wait_cqe(struct ibv_cq *cq, struct ibv_wc *wc);
int t_post_write(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *buf,
		 size_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm,
		 unsigned flags);
/* Waits (20 s at most) until p[0..n) equals want. */
int t_wait_bytes(const volatile void *p, const void *want, size_t n);
int t_post_recv(struct ibv_qp *qp, uint64_t wr_id, void *buf, size_t len, uint32_t lkey);
int t_qp_state(struct ibv_qp *qp);

/* Out-of-band messages over a socketpair. */
int t_send(int fd, const void *p, size_t n);
int t_recv(int fd, void *p, size_t n);
int t_send_u32(int fd, uint32_t v);
uint32_t t_recv_u32(int fd);

/* Runs child(fd) in a forked process and parent(fd, pid) here. Returns 0
 * if both return 0, T_SKIP if both skip, else 1. */
int t_fork2(int (*parent)(int fd, pid_t child, void *arg), int (*child)(int fd, void *arg),
	    void *arg);

/* Which libibverbs.so.1 this process loaded, and whether it is the sim. */
const char *t_libibverbs_path(void);
int t_under_sim(void);

/* The expected byte i of message k: differs between consecutive k. */
static inline uint8_t t_pattern(uint32_t k, size_t i)
{
	return (uint8_t)(i * 131u + k * 29u + 7u);
}

#endif
