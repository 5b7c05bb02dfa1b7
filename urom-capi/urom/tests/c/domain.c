/*
 * A domain of two ranks through urom's DOCA-named C API, as a DOCA UROM host builds one: two
 * processes (fork), each with its own progress engine, service and worker running the
 * domain-lookups plugin, meet through an out-of-band allgather the program implements itself
 * over a socket pair (non-blocking, tested from req_test). Each rank adds one buffer, starts the
 * domain, progresses it to running, then asks its worker's plugin what the domain lookups say
 * about the other rank: its plugin address, the segment of its buffer and its keys. Needs a
 * daemon offering worker_domain_lookups (UROM_SERVICE_SOCKET); prints "domain ok" when both
 * ranks passed every check.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <doca_buf.h>
#include <doca_urom.h>

#include "check.h"
#include "ranks.h"

static uint64_t domain_id(uint32_t rank)
{
	return 100 + rank;
}

static uint64_t buffer_va(uint32_t rank)
{
	return 0x100000ull * (rank + 1);
}

static void keys_of(uint32_t rank, char *memh, char *mkey, size_t len)
{
	snprintf(memh, len, "memh of rank %u", rank);
	snprintf(mkey, len, "mkey of rank %u", rank);
}

/* State changes seen by the domain, in order. */
struct transitions {
	int count;
	enum doca_ctx_states seen[8];
};

static void state_changed(const union doca_data user_data,
			  struct doca_ctx *ctx,
			  enum doca_ctx_states prev,
			  enum doca_ctx_states next)
{
	struct transitions *t = user_data.ptr;

	(void)ctx;
	CHECK(t->count == 0 || t->seen[t->count - 1] == prev, "transitions chain");
	if (t->count < 8)
		t->seen[t->count++] = next;
}

/* What the domain-lookups plugin found about a member, address and segment. */
struct lookups_detail {
	int32_t status[4];
	int32_t seg;
	uint32_t memh_len;
	uint32_t mkey_len;
	uint32_t addr_len;
	char addr[64];
	uint8_t memh[32];
	uint8_t mkey[32];
};

struct lookups_cmd {
	uint64_t domain_id;
	uint64_t va;
	int32_t seg;
	uint32_t zero;
};

struct answer {
	int done;
	doca_error_t status;
	struct lookups_detail detail;
};

static void lookups_done(struct doca_urom_worker_cmd_task *task,
			 union doca_data task_user_data,
			 union doca_data ctx_user_data)
{
	struct answer *answer = task_user_data.ptr;
	size_t len;

	(void)ctx_user_data;
	answer->status = doca_task_get_status(doca_urom_worker_cmd_task_as_task(task));
	len = copy_response(task, &answer->detail, sizeof(answer->detail));
	CHECK(len == sizeof(answer->detail), "a notification of %zu bytes", len);
	answer->done = 1;
	OK(doca_urom_worker_cmd_task_release(task));
}

/* Asks the worker's plugin what the lookups say about member `id`, `va` and segment 0. */
static void ask(struct doca_pe *pe,
		struct doca_urom_worker *worker,
		uint64_t plugin,
		uint64_t id,
		uint64_t va,
		struct answer *answer)
{
	struct doca_urom_worker_cmd_task *task;
	struct doca_buf *payload;
	union doca_data data = {.ptr = answer};
	struct lookups_cmd cmd = {.domain_id = id, .va = va, .seg = 0, .zero = 0};
	void *room;
	time_t deadline = time(NULL) + WAIT_SECONDS;

	memset(answer, 0, sizeof(*answer));
	OK(doca_urom_worker_cmd_task_allocate_init(worker, plugin, &task));
	doca_urom_worker_cmd_task_set_cb(task, lookups_done);
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
	payload = doca_urom_worker_cmd_task_get_payload(task);
	OK(doca_buf_get_data(payload, &room));
	memcpy(room, &cmd, sizeof(cmd));
	OK(doca_buf_set_data(payload, room, sizeof(cmd)));
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
	while (!answer->done) {
		CHECK(time(NULL) < deadline, "no answer from the plugin");
		doca_pe_progress(pe);
	}
	OK(answer->status);
}

static void run_rank(uint32_t rank, int fd)
{
	struct doca_pe *pe;
	struct doca_urom_service *service;
	struct doca_urom_worker *worker;
	struct doca_urom_domain *domain;
	struct doca_ctx *ctx;
	const struct doca_urom_service_plugin_info *plugins;
	size_t count, i;
	uint64_t lookups = 0;
	uint64_t ids[1] = {domain_id(rank)};
	struct doca_urom_worker *workers[1];
	struct oob oob = {.fd = fd, .rank = rank};
	struct doca_urom_domain_oob_coll coll = oob_coll(&oob);
	char memh[32], mkey[32], peer_memh[32], peer_mkey[32];
	uint32_t peer = 1 - rank;
	struct transitions transitions = {0};
	union doca_data data = {.ptr = &transitions};
	struct answer mine, theirs;

	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	OK(doca_pe_connect_ctx(pe, doca_urom_service_as_ctx(service)));
	OK(doca_ctx_start(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_domain_lookups") == 0)
			lookups = plugins[i].id;
	CHECK(lookups != 0, "the service offers worker_domain_lookups");

	OK(doca_urom_worker_create(&worker));
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(pe, doca_urom_worker_as_ctx(worker)));
	OK(doca_urom_worker_set_plugins(worker, lookups));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, 4));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(worker)));
	CHECK(progress_from(pe, doca_urom_worker_as_ctx(worker), DOCA_CTX_STATE_STARTING) ==
		      DOCA_CTX_STATE_RUNNING,
	      "rank %u: the worker runs", rank);

	/* The domain, as DOCA's samples set one up. */
	OK(doca_urom_domain_create(&domain));
	ctx = doca_urom_domain_as_ctx(domain);
	CHECK(ctx != NULL, "the domain is a context");
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, state_changed));
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_domain_set_oob(domain, &coll));
	workers[0] = worker;
	OK(doca_urom_domain_set_workers(domain, ids, workers, 1));
	keys_of(rank, memh, mkey, sizeof(memh));
	OK(doca_urom_domain_set_buffers_count(domain, 1));
	OK(doca_urom_domain_add_buffer(domain, (void *)(uintptr_t)buffer_va(rank), 4096, memh, strlen(memh),
				       mkey, strlen(mkey)));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_STARTING, "rank %u: the domain starts", rank);
	CHECK(progress_from(pe, ctx, DOCA_CTX_STATE_STARTING) == DOCA_CTX_STATE_RUNNING,
	      "rank %u: the domain runs", rank);
	CHECK(transitions.count == 2 && transitions.seen[0] == DOCA_CTX_STATE_STARTING &&
		      transitions.seen[1] == DOCA_CTX_STATE_RUNNING,
	      "rank %u: %d state changes", rank, transitions.count);
	CHECK(oob.allgathers >= 2, "rank %u: %d allgathers", rank, oob.allgathers);
	CHECK(oob.live == 0, "rank %u: %d requests were not freed", rank, oob.live);

	/* Running: no settings, no destroy. */
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_buffers_count(domain, 2));
	IS(DOCA_ERROR_BAD_STATE, doca_urom_domain_set_oob(domain, &coll));
	IS(DOCA_ERROR_NOT_PERMITTED, doca_urom_domain_destroy(domain));

	/* The worker's plugin finds the other rank's worker and buffer, and its own. */
	keys_of(peer, peer_memh, peer_mkey, sizeof(peer_memh));
	ask(pe, worker, lookups, domain_id(peer), buffer_va(peer) + 16, &theirs);
	for (i = 0; i < 4; i++)
		CHECK(theirs.detail.status[i] == DOCA_SUCCESS, "rank %u: lookup %zu of the other rank: %s", rank, i,
		      doca_error_get_name(theirs.detail.status[i]));
	CHECK(theirs.detail.seg == 0, "rank %u: segment %d", rank, theirs.detail.seg);
	CHECK(theirs.detail.mkey_len == strlen(peer_mkey) &&
		      memcmp(theirs.detail.mkey, peer_mkey, strlen(peer_mkey)) == 0,
	      "rank %u: the other rank's remote key", rank);
	CHECK(theirs.detail.memh_len == strlen(peer_memh) &&
		      memcmp(theirs.detail.memh, peer_memh, strlen(peer_memh)) == 0,
	      "rank %u: the other rank's memory handle", rank);
	CHECK(strncmp(theirs.detail.addr, "domain-lookups@", 15) == 0, "rank %u: address %s", rank,
	      theirs.detail.addr);
	ask(pe, worker, lookups, domain_id(rank), buffer_va(rank), &mine);
	CHECK(mine.detail.status[0] == DOCA_SUCCESS && strcmp(mine.detail.addr, theirs.detail.addr) != 0,
	      "rank %u: its own worker's address %s differs from the other's %s", rank, mine.detail.addr,
	      theirs.detail.addr);
	CHECK(mine.detail.mkey_len == strlen(mkey) && memcmp(mine.detail.mkey, mkey, strlen(mkey)) == 0,
	      "rank %u: its own remote key", rank);

	/* Stopped at once; then everything goes. */
	OK(doca_ctx_stop(ctx));
	CHECK(state_of(ctx) == DOCA_CTX_STATE_IDLE, "rank %u: a stopped domain is idle", rank);
	OK(doca_urom_domain_destroy(domain));
	end_rank(pe, service, worker);
	printf("rank %u: the domain of %d ranks ran\n", rank, RANKS);
	fflush(stdout);
}

int main(void)
{
	run_ranks(run_rank);
	printf("domain ok\n");
	return 0;
}
