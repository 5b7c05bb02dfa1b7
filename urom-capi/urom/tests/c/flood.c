/*
 * The submission rule from C: a worker with IN_FLIGHT command tasks keeps all of them in flight
 * until TOTAL graph loopbacks have completed, without a retry loop. The IN_FLIGHT tasks are
 * submitted at once (more than the channel to the worker holds when above 256), then each is
 * submitted again from its own completion callback; every doca_task_submit() must return
 * DOCA_SUCCESS. Each loopback must complete once, successfully, with its own value. A task
 * beyond the limit is refused when allocated (DOCA_ERROR_NO_MEMORY). Exits 0 and prints
 * "flood ok" when every check passed.
 *
 *   flood IN_FLIGHT TOTAL
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <doca_buf.h>
#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

struct loopback {
	uint64_t type;
	uint64_t data;
};

struct flood {
	uint64_t total;
	uint64_t next; /* the next value to send */
	uint64_t done; /* loopbacks completed */
	unsigned char *seen;
};

static void fill(struct doca_urom_worker_cmd_task *task, uint64_t value)
{
	struct doca_buf *payload = doca_urom_worker_cmd_task_get_payload(task);
	struct loopback *cmd;

	((uint64_t *)doca_urom_worker_cmd_task_get_user_data(task))[0] = value;
	OK(doca_buf_get_data(payload, (void **)&cmd));
	cmd->type = 0;
	cmd->data = value;
	OK(doca_buf_set_data(payload, cmd, sizeof(*cmd)));
}

static void loopback_done(struct doca_urom_worker_cmd_task *task,
			  union doca_data task_user_data,
			  union doca_data ctx_user_data)
{
	struct flood *flood = task_user_data.ptr;
	uint64_t sent = ((uint64_t *)doca_urom_worker_cmd_task_get_user_data(task))[0];
	struct loopback back;

	(void)ctx_user_data;
	OK(doca_task_get_status(doca_urom_worker_cmd_task_as_task(task)));
	CHECK(copy_response(task, &back, sizeof(back)) == sizeof(back), "a whole answer");
	CHECK(back.data == sent, "%lu came back for %lu", (unsigned long)back.data, (unsigned long)sent);
	CHECK(sent < flood->total && !flood->seen[sent], "loopback %lu completed twice", (unsigned long)sent);
	flood->seen[sent] = 1;
	flood->done++;
	if (flood->next < flood->total) {
		/* No retry: submission within the limit succeeds. */
		fill(task, flood->next++);
		OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
	} else {
		OK(doca_urom_worker_cmd_task_release(task));
	}
}

static uint64_t graph_id(struct doca_urom_service *service)
{
	const struct doca_urom_service_plugin_info *plugins;
	size_t count, i;

	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, "worker_graph") == 0)
			return plugins[i].id;
	CHECK(0, "the service does not offer worker_graph");
	return 0;
}

int main(int argc, char **argv)
{
	struct flood flood = {0};
	union doca_data data = {.ptr = &flood};
	struct doca_pe *pe;
	struct doca_urom_service *service;
	struct doca_urom_worker *worker;
	struct doca_urom_worker_cmd_task *task;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	uint32_t in_flight, i;
	uint64_t graph, n;
	size_t pending;

	CHECK(argc == 3, "usage: flood IN_FLIGHT TOTAL");
	in_flight = (uint32_t)strtoul(argv[1], NULL, 10);
	flood.total = strtoull(argv[2], NULL, 10);
	CHECK(in_flight > 0 && flood.total >= in_flight, "IN_FLIGHT %u, TOTAL %lu", in_flight,
	      (unsigned long)flood.total);
	flood.seen = calloc(flood.total, 1);
	CHECK(flood.seen != NULL, "memory for %lu marks", (unsigned long)flood.total);

	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	OK(doca_pe_connect_ctx(pe, doca_urom_service_as_ctx(service)));
	OK(doca_ctx_start(doca_urom_service_as_ctx(service)));
	graph = graph_id(service);

	OK(doca_urom_worker_create(&worker));
	ctx = doca_urom_worker_as_ctx(worker);
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_worker_set_max_inflight_tasks(worker, in_flight));
	OK(doca_urom_worker_set_plugins(worker, graph));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	do {
		doca_pe_progress(pe);
		OK(doca_ctx_get_state(ctx, &state));
	} while (state == DOCA_CTX_STATE_STARTING);
	CHECK(state == DOCA_CTX_STATE_RUNNING, "the worker runs");

	/* Every task at once, no progress in between. */
	for (i = 0; i < in_flight; i++) {
		OK(doca_urom_worker_cmd_task_allocate_init(worker, graph, &task));
		doca_urom_worker_cmd_task_set_cb(task, loopback_done);
		doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
		fill(task, flood.next++);
		OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
	}
	OK(doca_ctx_get_num_inflight_tasks(ctx, &pending));
	CHECK(pending == in_flight, "%zu in flight", pending);
	/* One beyond the limit. */
	IS(DOCA_ERROR_NO_MEMORY, doca_urom_worker_cmd_task_allocate_init(worker, graph, &task));

	while (flood.done < flood.total)
		doca_pe_progress(pe);
	for (n = 0; n < flood.total; n++)
		CHECK(flood.seen[n], "loopback %lu completed", (unsigned long)n);
	OK(doca_ctx_get_num_inflight_tasks(ctx, &pending));
	CHECK(pending == 0, "nothing left in flight");

	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
	do {
		doca_pe_progress(pe);
		OK(doca_ctx_get_state(ctx, &state));
	} while (state != DOCA_CTX_STATE_IDLE);
	OK(doca_urom_worker_destroy(worker));
	OK(doca_ctx_stop(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
	free(flood.seen);
	printf("flood ok: %lu loopbacks, %u in flight\n", (unsigned long)flood.total, in_flight);
	return 0;
}
