/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The simulated fabric: settings, the shared registry, shared object files,
 * process liveness and the executors' doorbells.
 *
 * A fabric is a directory (per user, named by DCHAN_VSIM_FABRIC) holding
 *   registry     contexts (with their doorbells) and the MR key table
 *   qp-<qpn>     one per QP: state, responder attributes, receive queue
 *   cq-<id>      one per CQ: the completion ring
 *   srq-<id>     one per SRQ: the shared receive ring
 * Processes that open a device of the same fabric can reach each other's
 * QPs by QPN, exactly the address real hardware uses.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define VSIM_REG_MAGIC 0x7673696d52454732ULL  /* "vsimREG2": context mailboxes */
#define VSIM_OBJ_MAGIC 0x7673696d4f424a31ULL  /* "vsimOBJ1" */

struct vsim_config vsim_cfg;
struct vsim_registry *vsim_reg;
static pthread_mutex_t fabric_lock = PTHREAD_MUTEX_INITIALIZER;

void vsim_log_impl(int debug, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	n = snprintf(buf, sizeof(buf), "vsim[%d]%s: ", (int)getpid(), debug ? " debug" : "");
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", buf);
}

__attribute__((noreturn, visibility("hidden")))
void vsim_not_emulated(const char *name);
void vsim_not_emulated(const char *name)
{
	vsim_log("%s() is not emulated by the verbs simulation (tests/verbs-sim/README.md)", name);
	abort();
}

uint64_t vsim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void vsim_sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ULL),
			       .tv_nsec = (long)(ns % 1000000000ULL) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static uint64_t env_u64(const char *name, uint64_t def, uint64_t max)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v > max) {
		vsim_log("ignoring %s=%s (not a number up to %llu)", name, s,
			 (unsigned long long)max);
		return def;
	}
	return v;
}

static int fabric_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= sizeof(vsim_cfg.fabric) || s[0] == '.')
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'))
			return 0;
	return 1;
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void config_load_once(void)
{
	struct vsim_config *c = &vsim_cfg;
	const char *s;
	int n;

	c->debug = (int)env_u64("DCHAN_VSIM_DEBUG", 0, 1);
	c->placement = VSIM_PLACE_INORDER;
	s = getenv("DCHAN_VSIM_PLACEMENT");
	if (s && *s) {
		if (!strcmp(s, "inorder"))
			c->placement = VSIM_PLACE_INORDER;
		else if (!strcmp(s, "reverse"))
			c->placement = VSIM_PLACE_REVERSE;
		else if (!strcmp(s, "torn"))
			c->placement = VSIM_PLACE_TORN;
		else if (!strcmp(s, "delayed"))
			c->placement = VSIM_PLACE_DELAYED;
		else
			vsim_log("ignoring DCHAN_VSIM_PLACEMENT=%s "
				 "(inorder|reverse|torn|delayed)", s);
	}
	c->stall_ns = env_u64("DCHAN_VSIM_STALL_US", 2000, 10000000) * 1000;
	c->delay_ns = env_u64("DCHAN_VSIM_DELAY_US", 2000, 10000000) * 1000;
	c->chunk = (size_t)env_u64("DCHAN_VSIM_CHUNK", 4096, 1 << 30);
	if (c->chunk < 8)
		c->chunk = 8;
	c->chunk &= ~(size_t)7;
	c->seed = env_u64("DCHAN_VSIM_SEED", 0, UINT64_MAX);
	if (!c->seed && getrandom(&c->seed, sizeof(c->seed), 0) != sizeof(c->seed))
		c->seed = vsim_now_ns() ^ (uint64_t)getpid();
	c->node = (unsigned)env_u64("DCHAN_VSIM_NODE", 0, 0xbffe);
	/* A device with fewer SGEs per WR, as many HCAs have for RDMA. */
	c->max_sge = (uint32_t)env_u64("DCHAN_VSIM_MAX_SGE", VSIM_MAX_SGE, VSIM_MAX_SGE);
	if (c->max_sge < 1)
		c->max_sge = 1;

	/* Which devices exist, in list order: "ib", "roce" or both. */
	c->ndev = 0;
	s = getenv("DCHAN_VSIM_DEVICES");
	if (!s)
		s = "ib,roce";
	{
		char buf[64], *save = NULL, *tok;

		snprintf(buf, sizeof(buf), "%s", s);
		for (tok = strtok_r(buf, ",", &save); tok && c->ndev < 2;
		     tok = strtok_r(NULL, ",", &save)) {
			if (!strcmp(tok, "ib"))
				c->devs[c->ndev++] = VSIM_DEV_IB;
			else if (!strcmp(tok, "roce"))
				c->devs[c->ndev++] = VSIM_DEV_ROCE;
			else
				vsim_log("ignoring device '%s' in DCHAN_VSIM_DEVICES (ib,roce)",
					 tok);
		}
		if (c->ndev == 2 && c->devs[0] == c->devs[1])
			c->ndev = 1;
	}

	s = getenv("DCHAN_VSIM_FABRIC");
	if (!s || !*s)
		s = "default";
	if (!fabric_name_ok(s)) {
		vsim_log("DCHAN_VSIM_FABRIC=%s is not a plain name; using 'default'", s);
		s = "default";
	}
	snprintf(c->fabric, sizeof(c->fabric), "%s", s);

	s = getenv("DCHAN_VSIM_DIR");
	if (s && *s) {
		n = snprintf(c->dir, sizeof(c->dir) - 64, "%s/%s", s, c->fabric);
	} else {
		struct stat st;
		const char *base = (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) ?
				   "/dev/shm" : "/tmp";

		n = snprintf(c->dir, sizeof(c->dir) - 64, "%s/dchan-vsim-%u/%s", base,
			     (unsigned)geteuid(), c->fabric);
	}
	/* Room is left for the object names inside the directory. */
	if (n < 0 || n >= (int)sizeof(c->dir) - 64) {
		vsim_log("DCHAN_VSIM_DIR is too long; using /tmp");
		n = snprintf(c->dir, sizeof(c->dir), "/tmp/dchan-vsim-%u-%.79s",
			     (unsigned)geteuid(), c->fabric);
		(void)n;
	}
}

void vsim_config_load(void)
{
	pthread_once(&config_once, config_load_once);
}

/* ---- locks -------------------------------------------------------------- */

int vsim_mutex_init_shared(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;
	int rc;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	/* A process killed inside a critical section must not wedge its peers. */
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	rc = pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
	return rc;
}

void vsim_lock(pthread_mutex_t *m)
{
	int rc = pthread_mutex_lock(m);

	if (rc == EOWNERDEAD) {
		vsim_dbg("recovered a lock held by a process that died");
		pthread_mutex_consistent(m);
	} else if (rc) {
		vsim_log("cannot take a fabric lock: %s", strerror(rc));
		abort();
	}
}

void vsim_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
}

/* ---- process identity and liveness -------------------------------------- */

/* Field 22 of /proc/<pid>/stat (start time in ticks) and the state letter. */
static int read_proc_stat(pid_t pid, uint64_t *starttime, char *state)
{
	char path[64], buf[1024], *p;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	p = strrchr(buf, ')');  /* the command name may contain anything */
	if (!p)
		return -1;
	p += 2;
	*state = *p;
	for (field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p)
		return -1;
	*starttime = strtoull(p, NULL, 10);
	return 0;
}

static struct {
	pid_t pid;
	uint64_t starttime;
} self_id;

void vsim_self_owner(struct vsim_owner *o)
{
	pid_t pid = getpid();
	char st;

	/* Recomputed after a fork: the child is another process. */
	if (self_id.pid != pid) {
		uint64_t t = 0;

		read_proc_stat(pid, &t, &st);
		self_id.starttime = t;
		self_id.pid = pid;
	}
	memset(o, 0, sizeof(*o));
	o->pid = pid;
	o->starttime = self_id.starttime;
}

#define ALIVE_CACHE 64
static struct {
	pid_t pid;
	uint64_t starttime;
	int fd;
} alive_cache[ALIVE_CACHE];
static unsigned alive_next;
static pthread_mutex_t alive_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * A pidfd becomes readable when its process exits, zombies included (a
 * killed child its parent has not reaped yet must count as dead, as its
 * HCA resources would be gone). Checking the start time once when the
 * pidfd is opened rules out a recycled pid.
 */
int vsim_owner_alive(const struct vsim_owner *o)
{
	struct pollfd pfd;
	int i, fd = -1, alive;

	if (o->pid == getpid())
		return 1;
	if (o->pid <= 0)
		return 0;
	pthread_mutex_lock(&alive_lock);
	for (i = 0; i < ALIVE_CACHE; i++)
		if (alive_cache[i].fd > 0 && alive_cache[i].pid == o->pid &&
		    alive_cache[i].starttime == o->starttime) {
			fd = alive_cache[i].fd;
			break;
		}
	if (fd < 0) {
		uint64_t t;
		char st;

		fd = (int)syscall(SYS_pidfd_open, o->pid, 0);
		if (fd < 0) {
			alive = (errno != ESRCH) && kill(o->pid, 0) == 0 &&
				read_proc_stat(o->pid, &t, &st) == 0 &&
				t == o->starttime && st != 'Z' && st != 'X';
			pthread_mutex_unlock(&alive_lock);
			return alive;
		}
		if (read_proc_stat(o->pid, &t, &st) || t != o->starttime ||
		    st == 'Z' || st == 'X') {
			close(fd);
			pthread_mutex_unlock(&alive_lock);
			return 0;
		}
		i = (int)(alive_next++ % ALIVE_CACHE);
		if (alive_cache[i].fd > 0)
			close(alive_cache[i].fd);
		alive_cache[i].pid = o->pid;
		alive_cache[i].starttime = o->starttime;
		alive_cache[i].fd = fd;
	}
	pfd.fd = fd;
	pfd.events = POLLIN;
	pfd.revents = 0;
	alive = !(poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)));
	pthread_mutex_unlock(&alive_lock);
	return alive;
}

/* ---- the registry -------------------------------------------------------- */

static int mkdir_private(const char *path)
{
	struct stat st;

	if (mkdir(path, 0700) && errno != EEXIST)
		return -1;
	if (lstat(path, &st))
		return -1;
	/* Refuse a directory planted by someone else (e.g. in /tmp). */
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
		errno = EPERM;
		return -1;
	}
	return 0;
}

static int make_fabric_dir(void)
{
	char path[PATH_MAX], *p;

	snprintf(path, sizeof(path), "%s", vsim_cfg.dir);
	/* Create the last two levels (per-user dir and fabric dir) privately. */
	p = strrchr(path, '/');
	if (p && p != path) {
		*p = 0;
		if (mkdir_private(path) && errno != EPERM) {
			/* DCHAN_VSIM_DIR may name an existing, shared parent. */
			struct stat st;

			if (stat(path, &st) || !S_ISDIR(st.st_mode))
				return -1;
		}
		*p = '/';
	}
	return mkdir_private(path);
}

int vsim_fabric_attach(void)
{
	char path[PATH_MAX + 16];
	struct stat st;
	void *m;
	int fd, rc = 0;

	vsim_config_load();
	pthread_mutex_lock(&fabric_lock);
	if (vsim_reg)
		goto out;
	if (make_fabric_dir()) {
		rc = errno;
		vsim_log("cannot create the fabric directory %s: %s", vsim_cfg.dir, strerror(rc));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/registry", vsim_cfg.dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = errno;
		vsim_log("cannot open %s: %s", path, strerror(rc));
		goto out;
	}
	/* The first process to get here initialises; the others wait for it. */
	flock(fd, LOCK_EX);
	if (fstat(fd, &st)) {
		rc = errno;
		goto close;
	}
	if (st.st_size == 0 && ftruncate(fd, sizeof(struct vsim_registry))) {
		rc = errno;
		goto close;
	}
	m = mmap(NULL, sizeof(struct vsim_registry), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		rc = errno;
		goto close;
	}
	vsim_reg = m;
	if (st.st_size == 0) {
		vsim_mutex_init_shared(&vsim_reg->lock);
		if (getrandom(&vsim_reg->nonce, sizeof(vsim_reg->nonce), 0) !=
		    sizeof(vsim_reg->nonce))
			vsim_reg->nonce = vsim_now_ns() ^ ((uint64_t)getpid() << 32);
		vsim_reg->next_qpn = 0x100 + (uint32_t)(vsim_reg->nonce & 0xfff);
		vsim_reg->next_obj = 1;
		vsim_reg->next_chan = 1;
		vsim_reg->next_pd = 1;
		vsim_reg->mr_tag = (uint32_t)(vsim_reg->nonce >> 16);
		atomic_thread_fence(memory_order_release);
		vsim_reg->magic = VSIM_REG_MAGIC;
	} else if (st.st_size != sizeof(struct vsim_registry) ||
		   vsim_reg->magic != VSIM_REG_MAGIC) {
		vsim_log("%s belongs to another version of the simulation; remove %s",
			 path, vsim_cfg.dir);
		munmap(m, sizeof(struct vsim_registry));
		vsim_reg = NULL;
		rc = EPROTO;
	}
close:
	flock(fd, LOCK_UN);
	close(fd);
out:
	pthread_mutex_unlock(&fabric_lock);
	return rc;
}

static const char *obj_prefix(int kind)
{
	switch (kind) {
	case VSIM_OBJ_QP: return "qp";
	case VSIM_OBJ_CQ: return "cq";
	default: return "srq";
	}
}

static void obj_path(char *buf, size_t len, int kind, uint32_t id)
{
	snprintf(buf, len, "%s/%s-%u", vsim_cfg.dir, obj_prefix(kind), id);
}

/*
 * Objects of processes that died without cleaning up: free their registry
 * slots and remove their files. Runs when a context opens, so a long test
 * series does not run out of slots.
 */
void vsim_sweep_dead(void)
{
	char path[PATH_MAX + 64];
	struct dirent *de;
	DIR *d;
	int i;

	vsim_lock(&vsim_reg->lock);
	for (i = 0; i < VSIM_MAX_CTX; i++)
		if (vsim_reg->ctx[i].used && !vsim_owner_alive(&vsim_reg->ctx[i].owner))
			vsim_reg->ctx[i].used = 0;
	for (i = 0; i < VSIM_MAX_MR; i++)
		if (vsim_reg->mr[i].used && !vsim_owner_alive(&vsim_reg->mr[i].owner))
			vsim_reg->mr[i].used = 0;
	vsim_unlock(&vsim_reg->lock);

	d = opendir(vsim_cfg.dir);
	if (!d)
		return;
	while ((de = readdir(d))) {
		struct vsim_shm_hdr h;
		int fd;

		if (strncmp(de->d_name, "qp-", 3) && strncmp(de->d_name, "cq-", 3) &&
		    strncmp(de->d_name, "srq-", 4))
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", vsim_cfg.dir, de->d_name) >=
		    (int)sizeof(path))
			continue;
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
		    h.magic == VSIM_OBJ_MAGIC && !vsim_owner_alive(&h.owner))
			unlink(path);
		close(fd);
	}
	closedir(d);
}

void vsim_ring(uint32_t ctx_slot, uint32_t ctx_gen)
{
	struct vsim_ctx_slot *c;

	if (ctx_slot >= VSIM_MAX_CTX)
		return;
	c = &vsim_reg->ctx[ctx_slot];
	if (!c->used || c->gen != ctx_gen)
		return;
	atomic_fetch_add(&c->doorbell, 1);
	/* Not FUTEX_PRIVATE: the sleeper may be in another process. */
	syscall(SYS_futex, &c->doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* ---- shared object files ------------------------------------------------ */

int vsim_obj_create(int kind, uint32_t id, size_t len, struct vsim_map *m)
{
	char path[PATH_MAX + 32];
	struct vsim_shm_hdr *h;
	void *p;
	int fd;

	obj_path(path, sizeof(path), kind, id);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	if (ftruncate(fd, (off_t)len)) {
		int e = errno;

		close(fd);
		unlink(path);
		return e;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		int e = errno;

		unlink(path);
		return e;
	}
	h = p;
	h->kind = (uint32_t)kind;
	h->id = id;
	vsim_self_owner(&h->owner);
	vsim_mutex_init_shared(&h->lock);
	m->addr = p;
	m->len = len;
	m->id = id;
	return 0;
}

/* The creator calls this once the object is fully initialised. */
void vsim_obj_publish(struct vsim_map *m)
{
	struct vsim_shm_hdr *h = m->addr;

	atomic_thread_fence(memory_order_release);
	h->magic = VSIM_OBJ_MAGIC;
}

int vsim_obj_open(int kind, uint32_t id, struct vsim_map *m)
{
	char path[PATH_MAX + 32];
	struct vsim_shm_hdr *h;
	struct stat st;
	void *p;
	int fd;

	obj_path(path, sizeof(path), kind, id);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return errno;
	if (fstat(fd, &st) || (size_t)st.st_size < sizeof(*h)) {
		close(fd);
		return ENOENT;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return errno;
	h = p;
	if (h->magic != VSIM_OBJ_MAGIC || h->kind != (uint32_t)kind || h->id != id) {
		munmap(p, (size_t)st.st_size);
		return ENOENT;
	}
	atomic_thread_fence(memory_order_acquire);
	m->addr = p;
	m->len = (size_t)st.st_size;
	m->id = id;
	return 0;
}

void vsim_obj_unlink(int kind, uint32_t id)
{
	char path[PATH_MAX + 32];

	obj_path(path, sizeof(path), kind, id);
	unlink(path);
}

void vsim_map_release(struct vsim_map *m)
{
	if (m->addr)
		munmap(m->addr, m->len);
	m->addr = NULL;
	m->len = 0;
	m->id = 0;
}

uint32_t vsim_alloc_qpn(void)
{
	uint32_t q;

	vsim_lock(&vsim_reg->lock);
	q = vsim_reg->next_qpn++;
	/* 24-bit QPNs; 0 and 1 are the special QPs of real ports. */
	if (vsim_reg->next_qpn > 0xffffff)
		vsim_reg->next_qpn = 0x100;
	vsim_unlock(&vsim_reg->lock);
	return q;
}

uint32_t vsim_alloc_obj_id(void)
{
	uint32_t id;

	vsim_lock(&vsim_reg->lock);
	id = vsim_reg->next_obj++;
	if (!vsim_reg->next_obj)
		vsim_reg->next_obj = 1;
	vsim_unlock(&vsim_reg->lock);
	return id;
}

/* ---- port addresses ----------------------------------------------------- */

uint16_t vsim_port_lid(enum vsim_devkind kind, unsigned node)
{
	return kind == VSIM_DEV_IB ? (uint16_t)(node + 1) : 0;
}

/*
 * IB: index 0 is the default GID, fe80:: + port GUID. RoCE: index 0 is a
 * link-local GID derived from a made-up MAC, index 1 the IPv4-mapped GID of
 * 10.86.x.y (RoCE v2), which is what most RoCE users pick.
 */
int vsim_port_gid(enum vsim_devkind kind, unsigned node, unsigned index, union ibv_gid *gid)
{
	unsigned n = node + 1;

	memset(gid, 0, sizeof(*gid));
	if (kind == VSIM_DEV_IB) {
		if (index != 0)
			return -1;
		gid->raw[0] = 0xfe;
		gid->raw[1] = 0x80;
		gid->raw[8] = 0x76;   /* port GUID: 76 73 69 6d 00 ib node */
		gid->raw[9] = 0x73;
		gid->raw[10] = 0x69;
		gid->raw[11] = 0x6d;
		gid->raw[13] = 0x01;
		gid->raw[14] = (uint8_t)(n >> 8);
		gid->raw[15] = (uint8_t)n;
		return 0;
	}
	if (index == 0) {
		/* fe80::0076:73ff:fe<n>: EUI-64 of MAC 02:76:73:00:nn:nn */
		gid->raw[0] = 0xfe;
		gid->raw[1] = 0x80;
		gid->raw[8] = 0x00;
		gid->raw[9] = 0x76;
		gid->raw[10] = 0x73;
		gid->raw[11] = 0xff;
		gid->raw[12] = 0xfe;
		gid->raw[13] = 0x00;
		gid->raw[14] = (uint8_t)(n >> 8);
		gid->raw[15] = (uint8_t)n;
		return 0;
	}
	if (index == 1) {
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		gid->raw[12] = 10;
		gid->raw[13] = 86;
		gid->raw[14] = (uint8_t)(n >> 8);
		gid->raw[15] = (uint8_t)n;
		return 0;
	}
	return -1;
}
