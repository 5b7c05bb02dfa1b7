/*
 * The ping-pong of DOCA UROM's guide through urom's DOCA-named C API, as a DOCA host runs it:
 * two ranks (fork), each with its own progress engine, service (at most 32 workers) and worker
 * (id = rank, 16 tasks in flight) running the sandbox plugin (worker_sandbox, version 1), join a
 * domain (ids [rank], no buffers) over an out-of-band allgather the program implements itself
 * on a socket pair, then pass the message worker to worker with the sandbox plugin's command
 * and notification bytes, inline, tag mask 0xffff, to (rank + 1) % 2:
 *
 *   rank 1 posts its receive of PONG (tag 0x5678, context 0xbeef), sends PING (tag 0x1234,
 *   strlen + 1 bytes), waits for both and prints "Client received PONG recv: <message>";
 *   rank 0 receives PING (context 0xdead), prints "Server completed PING recv: <message>" and
 *   sends PONG.
 *
 * Every notification is checked: its type, context, status, length, sender tag and bytes. A
 * command of the wrong length is refused with DOCA_ERROR_INVALID_VALUE. Then a last allgather
 * (the barrier), and the domain, the worker and the service go. Needs a daemon offering
 * worker_sandbox built with UCX (UROM_SERVICE_SOCKET); prints "ping-pong ok" when both ranks
 * passed every check.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <ucp/api/ucp.h>

#include <doca_buf.h>
#include <doca_urom.h>

#include "check.h"
#include "ranks.h"

#define PING_TAG 0x1234
#define PONG_TAG 0x5678
#define TAG_MASK 0xffff
#define SERVER_RECV_CONTEXT 0xdead
#define CLIENT_RECV_CONTEXT 0xbeef
#define SEND_CONTEXT 0x5e4d
/* The longest message (99 characters) and its NUL. */
#define RECV_COUNT 100
#define MESSAGE "hello from C"

/* The sandbox plugin's commands and notifications: a type word, then a union. */
enum { SANDBOX_MEM_MAP = 0, SANDBOX_TAG_SEND = 1, SANDBOX_TAG_RECV = 2 };

struct sandbox_mem_map_cmd {
	uint64_t context;
	ucp_mem_map_params_t map_params;
	size_t exported_memh_buffer_len; /* the exported memh bytes follow the command */
};

struct sandbox_tag_send_cmd {
	uint64_t context;
	uint64_t dest;    /* the domain id of the receiving worker */
	uint64_t buffer;  /* host address; unused inline */
	uint64_t count;   /* bytes; inline, they follow the command */
	uint64_t tag;
	uint64_t memh_id; /* 0: inline */
};

struct sandbox_tag_recv_cmd {
	uint64_t context;
	uint64_t buffer;
	uint64_t count; /* at most this many bytes */
	uint64_t tag;
	uint64_t tag_mask;
	uint64_t memh_id; /* 0: inline, the bytes follow the notification */
};

struct sandbox_cmd {
	uint64_t type;
	union {
		struct sandbox_mem_map_cmd mem_map;
		struct sandbox_tag_send_cmd tag_send;
		struct sandbox_tag_recv_cmd tag_recv;
	};
};

struct sandbox_tag_send_notif {
	uint64_t context;
	ucs_status_t status;
};

struct sandbox_tag_recv_notif {
	uint64_t context;
	void *buffer; /* not NULL: the bytes follow the notification */
	uint64_t count;
	uint64_t sender_tag;
	ucs_status_t status;
};

struct sandbox_notif {
	uint64_t type;
	union {
		struct {
			uint64_t context;
			uint64_t memh_id;
		} mem_map;
		struct sandbox_tag_send_notif tag_send;
		struct sandbox_tag_recv_notif tag_recv;
	};
};

_Static_assert(sizeof(struct sandbox_notif) == 48, "the sandbox notification is 48 bytes");
_Static_assert(offsetof(struct sandbox_tag_recv_notif, status) == 32, "tag_recv notification layout");

/* A finished command: its status and a copy of the plugin's notification. */
struct answer {
	int done;
	doca_error_t status;
	size_t len;
	uint8_t bytes[sizeof(struct sandbox_notif) + RECV_COUNT];
};

static void command_done(struct doca_urom_worker_cmd_task *task,
			 union doca_data task_user_data,
			 union doca_data ctx_user_data)
{
	struct answer *answer = task_user_data.ptr;

	(void)ctx_user_data;
	answer->status = doca_task_get_status(doca_urom_worker_cmd_task_as_task(task));
	answer->len = 0;
	if (answer->status == DOCA_SUCCESS)
		answer->len = copy_response(task, answer->bytes, sizeof(answer->bytes));
	answer->done = 1;
	OK(doca_urom_worker_cmd_task_release(task));
}

/* Submits `len` bytes of sandbox command `cmd` followed by `extra_len` bytes of `extra`. */
static void submit(struct doca_urom_worker *worker,
		   uint64_t plugin,
		   const void *cmd,
		   size_t len,
		   const void *extra,
		   size_t extra_len,
		   struct answer *answer)
{
	struct doca_urom_worker_cmd_task *task;
	struct doca_buf *payload;
	union doca_data data = {.ptr = answer};
	void *room;
	size_t capacity;

	memset(answer, 0, sizeof(*answer));
	OK(doca_urom_worker_cmd_task_allocate_init(worker, plugin, &task));
	doca_urom_worker_cmd_task_set_cb(task, command_done);
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
	payload = doca_urom_worker_cmd_task_get_payload(task);
	OK(doca_buf_get_data(payload, &room));
	OK(doca_buf_get_data_len(payload, &capacity));
	CHECK(len + extra_len <= capacity, "a command of %zu bytes in a payload of %zu", len + extra_len, capacity);
	memcpy(room, cmd, len);
	if (extra_len > 0)
		memcpy((uint8_t *)room + len, extra, extra_len);
	OK(doca_buf_set_data(payload, room, len + extra_len));
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
}

static void wait_for(struct doca_pe *pe, struct answer *answer, const char *what)
{
	time_t deadline = time(NULL) + WAIT_SECONDS;

	while (!answer->done) {
		CHECK(time(NULL) < deadline, "%s did not complete", what);
		doca_pe_progress(pe);
	}
}

static void tag_send(struct doca_urom_worker *worker, uint64_t plugin, uint64_t dest, uint64_t tag,
		     const char *message, struct answer *answer)
{
	struct sandbox_cmd cmd;

	memset(&cmd, 0, sizeof(cmd));
	cmd.type = SANDBOX_TAG_SEND;
	cmd.tag_send.context = SEND_CONTEXT;
	cmd.tag_send.dest = dest;
	cmd.tag_send.buffer = (uint64_t)(uintptr_t)message;
	cmd.tag_send.count = strlen(message) + 1;
	cmd.tag_send.tag = tag;
	cmd.tag_send.memh_id = 0;
	submit(worker, plugin, &cmd, sizeof(cmd), message, strlen(message) + 1, answer);
}

static void tag_recv(struct doca_urom_worker *worker, uint64_t plugin, uint64_t tag, uint64_t context,
		     struct answer *answer)
{
	struct sandbox_cmd cmd;

	memset(&cmd, 0, sizeof(cmd));
	cmd.type = SANDBOX_TAG_RECV;
	cmd.tag_recv.context = context;
	cmd.tag_recv.buffer = 0;
	cmd.tag_recv.count = RECV_COUNT;
	cmd.tag_recv.tag = tag;
	cmd.tag_recv.tag_mask = TAG_MASK;
	cmd.tag_recv.memh_id = 0;
	submit(worker, plugin, &cmd, sizeof(cmd), NULL, 0, answer);
}

static void check_sent(uint32_t rank, struct answer *answer, const char *what)
{
	struct sandbox_notif notif;

	OK(answer->status);
	CHECK(answer->len == sizeof(notif), "rank %u: %s: a notification of %zu bytes", rank, what, answer->len);
	memcpy(&notif, answer->bytes, sizeof(notif));
	CHECK(notif.type == SANDBOX_TAG_SEND, "rank %u: %s: notification type %llu", rank, what,
	      (unsigned long long)notif.type);
	CHECK(notif.tag_send.context == SEND_CONTEXT, "rank %u: %s: context %#llx", rank, what,
	      (unsigned long long)notif.tag_send.context);
	CHECK(notif.tag_send.status == UCS_OK, "rank %u: %s: UCX status %d", rank, what, (int)notif.tag_send.status);
}

/* Checks a finished inline receive of tag `tag` with `context`; copies its text into `text`. */
static void check_received(uint32_t rank, struct answer *answer, uint64_t tag, uint64_t context, const char *what,
			   char *text)
{
	struct sandbox_notif notif;
	size_t count;

	OK(answer->status);
	CHECK(answer->len >= sizeof(notif), "rank %u: %s: a notification of %zu bytes", rank, what, answer->len);
	memcpy(&notif, answer->bytes, sizeof(notif));
	CHECK(notif.type == SANDBOX_TAG_RECV, "rank %u: %s: notification type %llu", rank, what,
	      (unsigned long long)notif.type);
	CHECK(notif.tag_recv.context == context, "rank %u: %s: context %#llx, not %#llx", rank, what,
	      (unsigned long long)notif.tag_recv.context, (unsigned long long)context);
	CHECK(notif.tag_recv.status == UCS_OK, "rank %u: %s: UCX status %d", rank, what, (int)notif.tag_recv.status);
	CHECK((notif.tag_recv.sender_tag & TAG_MASK) == (tag & TAG_MASK), "rank %u: %s: sender tag %#llx", rank,
	      what, (unsigned long long)notif.tag_recv.sender_tag);
	CHECK(notif.tag_recv.buffer != NULL, "rank %u: %s: not inline", rank, what);
	count = (size_t)notif.tag_recv.count;
	CHECK(count == strlen(MESSAGE) + 1, "rank %u: %s: %zu bytes", rank, what, count);
	CHECK(answer->len == sizeof(notif) + count, "rank %u: %s: %zu bytes carry %zu", rank, what, answer->len,
	      count);
	memcpy(text, answer->bytes + sizeof(notif), count);
	CHECK(text[count - 1] == '\0', "rank %u: %s: no NUL at the end", rank, what);
	CHECK(strcmp(text, MESSAGE) == 0, "rank %u: %s: `%s`", rank, what, text);
}

static void ping_pong(struct doca_pe *pe, struct doca_urom_worker *worker, uint64_t sandbox, uint32_t rank)
{
	uint64_t dest = (rank + 1) % RANKS;
	struct answer send_answer, recv_answer;
	char text[RECV_COUNT];

	if (rank == 0) {
		tag_recv(worker, sandbox, PING_TAG, SERVER_RECV_CONTEXT, &recv_answer);
		wait_for(pe, &recv_answer, "the PING receive");
		check_received(rank, &recv_answer, PING_TAG, SERVER_RECV_CONTEXT, "the PING receive", text);
		printf("Server completed PING recv: %s\n", text);
		tag_send(worker, sandbox, dest, PONG_TAG, text, &send_answer);
		wait_for(pe, &send_answer, "the PONG send");
		check_sent(rank, &send_answer, "the PONG send");
		return;
	}
	tag_recv(worker, sandbox, PONG_TAG, CLIENT_RECV_CONTEXT, &recv_answer);
	tag_send(worker, sandbox, dest, PING_TAG, MESSAGE, &send_answer);
	wait_for(pe, &send_answer, "the PING send");
	check_sent(rank, &send_answer, "the PING send");
	wait_for(pe, &recv_answer, "the PONG receive");
	check_received(rank, &recv_answer, PONG_TAG, CLIENT_RECV_CONTEXT, "the PONG receive", text);
	printf("Client received PONG recv: %s\n", text);
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
	uint64_t sandbox = 0, version = 0;
	uint64_t ids[1] = {rank};
	struct doca_urom_worker *workers[1];
	struct oob oob = {.fd = fd, .rank = rank};
	struct doca_urom_domain_oob_coll coll = oob_coll(&oob);
	struct sandbox_cmd bad;
	struct answer answer;

	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	OK(doca_urom_service_set_max_workers(service, 32));
	OK(doca_pe_connect_ctx(pe, doca_urom_service_as_ctx(service)));
	OK(doca_ctx_start(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_sandbox") == 0) {
			sandbox = plugins[i].id;
			version = plugins[i].version;
		}
	CHECK(sandbox != 0, "rank %u: the service offers worker_sandbox", rank);
	CHECK(version == 1, "rank %u: worker_sandbox has version %llu, not 1", rank, (unsigned long long)version);

	OK(doca_urom_worker_create(&worker));
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(pe, doca_urom_worker_as_ctx(worker)));
	OK(doca_urom_worker_set_id(worker, rank));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, 16));
	OK(doca_urom_worker_set_plugins(worker, sandbox));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(doca_urom_worker_as_ctx(worker)));
	CHECK(progress_from(pe, doca_urom_worker_as_ctx(worker), DOCA_CTX_STATE_STARTING) ==
		      DOCA_CTX_STATE_RUNNING,
	      "rank %u: the worker runs", rank);

	/* The domain, as DOCA's ping-pong sets one up: the worker as domain id = rank, no buffers. */
	OK(doca_urom_domain_create(&domain));
	ctx = doca_urom_domain_as_ctx(domain);
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_domain_set_oob(domain, &coll));
	workers[0] = worker;
	OK(doca_urom_domain_set_workers(domain, ids, workers, 1));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	CHECK(progress_from(pe, ctx, DOCA_CTX_STATE_STARTING) == DOCA_CTX_STATE_RUNNING, "rank %u: the domain runs",
	      rank);
	CHECK(oob.live == 0, "rank %u: %d requests were not freed", rank, oob.live);

	/* A tag send one byte short of what it says it carries is refused. */
	memset(&bad, 0, sizeof(bad));
	bad.type = SANDBOX_TAG_SEND;
	bad.tag_send.context = SEND_CONTEXT;
	bad.tag_send.dest = rank;
	bad.tag_send.count = 4;
	bad.tag_send.tag = 0x99;
	submit(worker, sandbox, &bad, sizeof(bad), "abc", 3, &answer);
	wait_for(pe, &answer, "the short command");
	IS(DOCA_ERROR_INVALID_VALUE, answer.status);

	ping_pong(pe, worker, sandbox, rank);

	/* Nobody leaves before everyone is done: a worker that went could fail a peer's receive. */
	OK(doca_ctx_stop(ctx));
	OK(doca_urom_domain_destroy(domain));
	barrier(&coll);
	CHECK(oob.live == 0, "rank %u: %d requests were not freed", rank, oob.live);
	end_rank(pe, service, worker);
	fflush(stdout);
}

int main(void)
{
	run_ranks(run_rank);
	printf("ping-pong ok\n");
	return 0;
}
