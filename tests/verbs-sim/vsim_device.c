/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Devices, contexts, device and port queries, and the small exported
 * helpers (strings, rates, fork status).
 *
 * Two devices exist: vsim_ib0, whose port 1 is InfiniBand (addressed by
 * LID), and vsim_roce0, whose port 1 is Ethernet (RoCE v2, addressed by GID
 * with a GRH). DCHAN_VSIM_DEVICES selects and orders them.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* The header turns these into macros; the library defines the functions. */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_get_device_list

pthread_mutex_t vsim_proc_lock = PTHREAD_MUTEX_INITIALIZER;
struct vsim_context *vsim_contexts;

/* Static: device pointers stay valid for the life of the process. */
static struct vsim_device devices[2];
static int ndevices;
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;

static void devices_init(void)
{
	int i;

	vsim_config_load();
	for (i = 0; i < vsim_cfg.ndev; i++) {
		struct vsim_device *d = &devices[i];
		const char *name = vsim_cfg.devs[i] == VSIM_DEV_IB ? "vsim_ib0" : "vsim_roce0";

		d->kind = vsim_cfg.devs[i];
		d->index = i;
		d->guid = (0x7673696dULL << 32) | ((uint64_t)d->kind << 24) | (vsim_cfg.node + 1);
		d->ibdev.node_type = IBV_NODE_CA;
		d->ibdev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
		snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", i);
		snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path),
			 "/sys/class/infiniband_verbs/uverbs%d", i);
		snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path),
			 "/sys/class/infiniband/%s", name);
	}
	ndevices = vsim_cfg.ndev;
}

static struct vsim_device *to_vdev(struct ibv_device *d)
{
	int i;

	for (i = 0; i < ndevices; i++)
		if (d == &devices[i].ibdev)
			return &devices[i];
	return NULL;
}

VSIM_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list;
	int i;

	pthread_once(&devices_once, devices_init);
	list = calloc((size_t)ndevices + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < ndevices; i++)
		list[i] = &devices[i].ibdev;
	if (num_devices)
		*num_devices = ndevices;
	return list;
}

VSIM_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

VSIM_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

VSIM_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	struct vsim_device *d = to_vdev(device);

	return d ? d->index : -1;
}

VSIM_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	struct vsim_device *d = to_vdev(device);

	return d ? htobe64(d->guid) : 0;
}

/*
 * librdmacm asks for it first (libfabric loads librdmacm for its own verbs
 * provider, so any program that probes libfabric under the simulation, as
 * dchan_info does, gets here). The real call returns the sysfs mount point;
 * the simulated devices have no entries there, so librdmacm then finds no
 * RDMA CM device and says so with an error code.
 */
const char *ibv_get_sysfs_path(void); /* declared in rdma-core's driver.h */

VSIM_EXPORT const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

/* As the real one: the file's text without its newline, or -1 (here, with
 * no RDMA in the kernel, librdmacm's abi_version is not there). */
VSIM_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[4096];
	ssize_t n;
	int fd;

	if (!size || snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size);
	close(fd);
	if (n <= 0)
		return -1;
	if ((size_t)n == size)
		n--;
	buf[n] = '\0';
	if (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	return (int)n;
}

/* ---- contexts ----------------------------------------------------------- */

static int query_port_op(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
			 size_t len);
static int query_device_ex_op(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
			      struct ibv_device_attr_ex *attr, size_t len);

/*
 * Cross Memory Attach is how data moves; check it once here so that a
 * kernel or container that forbids it fails at open, not as mysterious
 * remote access errors later.
 */
static int cma_probe(void)
{
	char src[8] = "vsim", dst[8] = "";
	struct iovec l = { dst, sizeof(dst) }, r = { src, sizeof(src) };

	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(src))
		return errno ? errno : EIO;
	return 0;
}

VSIM_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct vsim_device *d = to_vdev(device);
	struct vsim_context *c;
	int rc, i, slot = -1;

	if (!d) {
		errno = ENODEV;
		return NULL;
	}
	rc = vsim_fabric_attach();
	if (rc) {
		errno = rc;
		return NULL;
	}
	rc = cma_probe();
	if (rc) {
		vsim_log("process_vm_readv does not work here (%s): the simulation needs "
			 "Cross Memory Attach", strerror(rc));
		errno = rc;
		return NULL;
	}
	/* With Yama ptrace_scope=1, let sibling processes write into us. */
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	vsim_sweep_dead();

	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	vsim_lock(&vsim_reg->lock);
	for (i = 0; i < VSIM_MAX_CTX; i++)
		if (!vsim_reg->ctx[i].used) {
			slot = i;
			break;
		}
	if (slot >= 0) {
		struct vsim_ctx_slot *s = &vsim_reg->ctx[slot];

		s->used = 1;
		s->gen++;
		vsim_self_owner(&s->owner);
		s->owner.ctx_slot = (uint32_t)slot;
		s->owner.ctx_gen = s->gen;
		/* Nothing left over from the slot's last user. */
		vsim_mbox_reset(s);
		c->slot = (uint32_t)slot;
		c->gen = s->gen;
	}
	vsim_unlock(&vsim_reg->lock);
	if (slot < 0) {
		vsim_log("more than %d contexts open in fabric %s", VSIM_MAX_CTX, vsim_cfg.fabric);
		free(c);
		errno = ENOMEM;
		return NULL;
	}

	c->dev = d;
	c->placement = vsim_cfg.placement;
	c->rng = vsim_cfg.seed ^ ((uint64_t)getpid() << 20) ^ c->slot;
	pthread_mutex_init(&c->lock, NULL);

	/* A real verbs_context, so the header's inline wrappers take the
	 * extended paths exactly as with a hardware provider. */
	c->vctx.sz = sizeof(struct verbs_context);
	c->vctx.query_port = query_port_op;
	c->vctx.query_device_ex = query_device_ex_op;
	c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->vctx.context.device = device;
	c->vctx.context.cmd_fd = -1;
	c->vctx.context.num_comp_vectors = 1;
	pthread_mutex_init(&c->vctx.context.mutex, NULL);
	c->vctx.context.ops.poll_cq = vsim_poll_cq;
	c->vctx.context.ops.req_notify_cq = vsim_req_notify_cq;
	c->vctx.context.ops.post_send = vsim_post_send;
	c->vctx.context.ops.post_recv = vsim_post_recv;
	c->vctx.context.ops.post_srq_recv = vsim_post_srq_recv;

	c->vctx.context.async_fd = vsim_async_socket(c->slot, c->gen);
	if (c->vctx.context.async_fd < 0) {
		rc = errno;
		goto free_slot;
	}
	rc = vsim_svc_start(c);
	if (rc)
		goto close_async;
	rc = vsim_exec_start(c);
	if (rc)
		goto stop_svc;

	pthread_mutex_lock(&vsim_proc_lock);
	c->next = vsim_contexts;
	vsim_contexts = c;
	pthread_mutex_unlock(&vsim_proc_lock);
	vsim_dbg("opened %s (node %u, context slot %u, placement %d)", device->name,
		 vsim_cfg.node, c->slot, c->placement);
	return &c->vctx.context;

stop_svc:
	vsim_svc_stop(c);
close_async:
	close(c->vctx.context.async_fd);
free_slot:
	vsim_lock(&vsim_reg->lock);
	vsim_reg->ctx[c->slot].used = 0;
	vsim_unlock(&vsim_reg->lock);
	free(c);
	errno = rc;
	return NULL;
}

VSIM_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct vsim_context *c = to_vctx(context), **pp;
	int i;

	vsim_exec_stop(c);
	vsim_context_release_objects(c);
	/* Only now: requesters may write into our MRs until the QPs are
	 * gone, and their final words come through the mailbox. */
	vsim_svc_stop(c);

	vsim_lock(&vsim_reg->lock);
	for (i = 0; i < VSIM_MAX_MR; i++) {
		struct vsim_mr_slot *m = &vsim_reg->mr[i];

		if (m->used && m->owner.ctx_slot == c->slot && m->owner.ctx_gen == c->gen &&
		    m->owner.pid == getpid())
			m->used = 0;
	}
	vsim_reg->ctx[c->slot].used = 0;
	vsim_unlock(&vsim_reg->lock);

	pthread_mutex_lock(&vsim_proc_lock);
	for (pp = &vsim_contexts; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	pthread_mutex_unlock(&vsim_proc_lock);
	close(context->async_fd);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

/* ---- device and port queries -------------------------------------------- */

static void fill_device_attr(struct vsim_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "vsim-1.0");
	a->node_guid = htobe64(c->dev->guid);
	a->sys_image_guid = htobe64(c->dev->guid);
	a->max_mr_size = 1ULL << 40;
	a->page_size_cap = ~(uint64_t)4095;
	a->vendor_id = 0x7673;          /* not a registered vendor */
	a->vendor_part_id = c->dev->kind == VSIM_DEV_IB ? 1 : 2;
	a->hw_ver = 1;
	a->max_qp = VSIM_MAX_QP;
	a->max_qp_wr = VSIM_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
			      IBV_DEVICE_CHANGE_PHY_PORT | IBV_DEVICE_SYS_IMAGE_GUID;
	a->max_sge = (int)vsim_cfg.max_sge;
	a->max_sge_rd = (int)vsim_cfg.max_sge;
	a->max_cq = VSIM_MAX_CQ;
	a->max_cqe = VSIM_MAX_CQE;
	a->max_mr = VSIM_MAX_MR;
	a->max_pd = VSIM_MAX_PD;
	a->max_qp_rd_atom = VSIM_MAX_RD_ATOM;
	a->max_qp_init_rd_atom = VSIM_MAX_RD_ATOM;
	a->max_res_rd_atom = VSIM_MAX_RD_ATOM * VSIM_MAX_QP;
	/* Atomics cannot be made atomic with CMA, so the device has none. */
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_srq = VSIM_MAX_SRQ;
	a->max_srq_wr = VSIM_MAX_QP_WR;
	a->max_srq_sge = (int)vsim_cfg.max_sge;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
}

VSIM_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	fill_device_attr(to_vctx(context), attr);
	return 0;
}

static int query_device_ex_op(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
			      struct ibv_device_attr_ex *attr, size_t len)
{
	struct ibv_device_attr_ex full;

	if (in && in->comp_mask)
		return EINVAL;
	if (len < sizeof(attr->orig_attr))
		return EINVAL;
	memset(&full, 0, sizeof(full));
	fill_device_attr(to_vctx(ctx), &full.orig_attr);
	full.phys_port_cnt_ex = 1;
	memcpy(attr, &full, len < sizeof(full) ? len : sizeof(full));
	return 0;
}

int vsim_query_port_full(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	struct vsim_context *c = to_vctx(ctx);
	int ib = c->dev->kind == VSIM_DEV_IB;

	if (port != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	/* A RoCE port inherits the Ethernet MTU (1500 here): 1024 usable. */
	a->active_mtu = ib ? IBV_MTU_4096 : IBV_MTU_1024;
	a->gid_tbl_len = ib ? 1 : VSIM_GID_TBL_LEN;
	a->port_cap_flags = ib ? IBV_PORT_CM_SUP : (IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS);
	a->max_msg_sz = VSIM_MAX_MSG;
	a->pkey_tbl_len = 1;
	a->lid = vsim_port_lid(c->dev->kind, vsim_cfg.node);
	a->sm_lid = ib ? 1 : 0;
	a->max_vl_num = 1;
	a->subnet_timeout = ib ? 18 : 0;
	a->active_width = 2;            /* 4x */
	a->active_speed = 32;           /* EDR / 25 Gb/s per lane */
	a->phys_state = 5;              /* LinkUp */
	a->link_layer = ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int query_port_op(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
			 size_t len)
{
	struct ibv_port_attr full;
	int rc = vsim_query_port_full(ctx, port, &full);

	if (rc)
		return rc;
	memcpy(attr, &full, len < sizeof(full) ? len : sizeof(full));
	return 0;
}

/* The exported entry is the legacy one: its struct ends at link_layer. */
VSIM_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			       struct _compat_ibv_port_attr *port_attr)
{
	struct ibv_port_attr full;
	int rc = vsim_query_port_full(context, port_num, &full);

	if (rc)
		return rc;
	memcpy(port_attr, &full, offsetof(struct ibv_port_attr, flags));
	return 0;
}

static int gid_entry(struct ibv_context *ctx, uint32_t port, uint32_t index,
		     struct ibv_gid_entry *e)
{
	struct vsim_context *c = to_vctx(ctx);
	int len = c->dev->kind == VSIM_DEV_IB ? 1 : VSIM_GID_TBL_LEN;

	if (port != 1 || index >= (uint32_t)len)
		return EINVAL;
	memset(e, 0, sizeof(*e));
	if (vsim_port_gid(c->dev->kind, vsim_cfg.node, index, &e->gid))
		return ENODATA;
	e->gid_index = index;
	e->port_num = port;
	e->gid_type = c->dev->kind == VSIM_DEV_IB ? IBV_GID_TYPE_IB : IBV_GID_TYPE_ROCE_V2;
	e->ndev_ifindex = c->dev->kind == VSIM_DEV_IB ? 0 : 1;
	return 0;
}

VSIM_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
			      union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	int rc;

	if (index < 0)
		return -1;
	rc = gid_entry(context, port_num, (uint32_t)index, &e);
	if (rc == EINVAL)
		return -1;
	*gid = e.gid;  /* an empty entry reads as zeros, as on hardware */
	return 0;
}

VSIM_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
				  uint32_t gid_index, struct ibv_gid_entry *entry,
				  uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int rc;

	if (flags)
		return EINVAL;
	rc = gid_entry(context, port_num, gid_index, &e);
	if (rc)
		return rc;
	memcpy(entry, &e, entry_size < sizeof(e) ? entry_size : sizeof(e));
	return 0;
}

VSIM_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
					 struct ibv_gid_entry *entries, size_t max_entries,
					 uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	size_t n = 0;
	uint32_t i;

	if (flags || entry_size == 0)
		return -EINVAL;
	for (i = 0; i < VSIM_GID_TBL_LEN; i++) {
		if (gid_entry(context, 1, i, &e))
			continue;
		if (n == max_entries)
			return -EINVAL;
		memcpy((char *)entries + n * entry_size, &e,
		       entry_size < sizeof(e) ? entry_size : sizeof(e));
		n++;
	}
	return (ssize_t)n;
}

VSIM_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
			       __be16 *pkey)
{
	(void)context;
	if (port_num != 1 || index != 0)
		return -1;
	*pkey = htobe16(0xffff);
	return 0;
}

VSIM_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	(void)context;
	if (port_num != 1)
		return -1;
	return be16toh(pkey) == 0xffff ? 0 : -1;
}

/* ---- small helpers ------------------------------------------------------ */

VSIM_EXPORT int ibv_fork_init(void)
{
	/* Nothing is pinned, so fork needs no preparation. */
	return 0;
}

VSIM_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

/* Exported by libibverbs, no longer declared in its header. */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);

VSIM_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

VSIM_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

VSIM_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory window bind error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};

	if ((unsigned)status < sizeof(s) / sizeof(s[0]) && s[status])
		return s[status];
	return "unknown";
}

VSIM_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	switch (node_type) {
	case IBV_NODE_CA: return "InfiniBand channel adapter";
	case IBV_NODE_SWITCH: return "InfiniBand switch";
	case IBV_NODE_ROUTER: return "InfiniBand router";
	case IBV_NODE_RNIC: return "iWARP NIC";
	case IBV_NODE_USNIC: return "usNIC";
	case IBV_NODE_USNIC_UDP: return "usNIC UDP";
	case IBV_NODE_UNSPECIFIED: return "unspecified";
	default: return "unknown";
	}
}

VSIM_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	switch (port_state) {
	case IBV_PORT_NOP: return "PORT_NOP";
	case IBV_PORT_DOWN: return "PORT_DOWN";
	case IBV_PORT_INIT: return "PORT_INIT";
	case IBV_PORT_ARMED: return "PORT_ARMED";
	case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
	case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
	default: return "invalid state";
	}
}

VSIM_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	switch (event) {
	case IBV_EVENT_CQ_ERR: return "CQ error";
	case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
	case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
	case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
	case IBV_EVENT_COMM_EST: return "communication established";
	case IBV_EVENT_SQ_DRAINED: return "send queue drained";
	case IBV_EVENT_PATH_MIG: return "path migrated";
	case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
	case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
	case IBV_EVENT_PORT_ACTIVE: return "port active";
	case IBV_EVENT_PORT_ERR: return "port error";
	case IBV_EVENT_LID_CHANGE: return "LID change";
	case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
	case IBV_EVENT_SM_CHANGE: return "SM change";
	case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
	case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
	case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
	case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
	case IBV_EVENT_GID_CHANGE: return "GID table change";
	case IBV_EVENT_WQ_FATAL: return "WQ fatal";
	default: return "unknown";
	}
}

/* Rates: each enum value and its speed in Mb/s. */
static const struct {
	enum ibv_rate rate;
	int mbps;
} rates[] = {
	{ IBV_RATE_2_5_GBPS, 2500 }, { IBV_RATE_5_GBPS, 5000 },
	{ IBV_RATE_10_GBPS, 10000 }, { IBV_RATE_20_GBPS, 20000 },
	{ IBV_RATE_30_GBPS, 30000 }, { IBV_RATE_40_GBPS, 40000 },
	{ IBV_RATE_60_GBPS, 60000 }, { IBV_RATE_80_GBPS, 80000 },
	{ IBV_RATE_120_GBPS, 120000 }, { IBV_RATE_14_GBPS, 14062 },
	{ IBV_RATE_56_GBPS, 56250 }, { IBV_RATE_112_GBPS, 112500 },
	{ IBV_RATE_168_GBPS, 168750 }, { IBV_RATE_25_GBPS, 25781 },
	{ IBV_RATE_100_GBPS, 103125 }, { IBV_RATE_200_GBPS, 206250 },
	{ IBV_RATE_300_GBPS, 309375 }, { IBV_RATE_28_GBPS, 28125 },
	{ IBV_RATE_50_GBPS, 53125 }, { IBV_RATE_400_GBPS, 425000 },
	{ IBV_RATE_600_GBPS, 637500 }, { IBV_RATE_800_GBPS, 850000 },
	{ IBV_RATE_1200_GBPS, 1275000 },
};

VSIM_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	size_t i;

	for (i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

VSIM_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	size_t i;

	for (i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

/* Only the original SDR-based rates are multiples of 2.5 Gb/s. */
VSIM_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	size_t i;

	for (i = 0; i < 9; i++)
		if (rates[i].rate == rate)
			return rates[i].mbps / 2500;
	return -1;
}

VSIM_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	size_t i;

	for (i = 0; i < 9; i++)
		if (rates[i].mbps == mult * 2500)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

VSIM_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

VSIM_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

VSIM_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	/* No QP is created with the extended send API. */
	(void)qp;
	return NULL;
}
