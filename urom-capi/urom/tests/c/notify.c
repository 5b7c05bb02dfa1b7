/*
 * An event-driven DOCA loop: the program sleeps in epoll_wait() on its own epoll set, which
 * holds the progress engine's notification handle, and progresses only when woken, as DOCA
 * documents it: doca_pe_request_notification(), wait, doca_pe_clear_notification(), then
 * doca_pe_progress() until it finds nothing. The worker starts, LOOPBACKS graph loopbacks
 * complete one at a time and the worker stops, all through that loop; while nothing is in
 * flight, a wait of one second costs next to no CPU time (no busy loop). Exits 0 and prints
 * "notify ok" when every check passed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <doca_buf.h>
#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

#define LOOPBACKS 100

struct loopback {
	uint64_t type;
	uint64_t data;
};

/* The program's event loop: its own epoll set with the engine's handle in it. */
struct loop {
	struct doca_pe *pe;
	int epoll;
	unsigned long wakeups;
	unsigned long completed;
	uint64_t last;
};

static double seconds(clockid_t clock)
{
	struct timespec ts;

	CHECK(clock_gettime(clock, &ts) == 0, "clock_gettime: %s", strerror(errno));
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One turn: request, sleep up to `timeout_ms` (-1: until woken), clear, progress until nothing
 * is left. Whether the engine's handle woke it. */
static int turn(struct loop *loop, int timeout_ms)
{
	struct epoll_event event;
	doca_notification_handle_t handle;
	int n;

	OK(doca_pe_request_notification(loop->pe));
	do
		n = epoll_wait(loop->epoll, &event, 1, timeout_ms);
	while (n < 0 && errno == EINTR);
	CHECK(n >= 0, "epoll_wait: %s", strerror(errno));
	if (n > 0) {
		OK(doca_pe_get_notification_handle(loop->pe, &handle));
		CHECK(event.data.fd == handle, "woken by descriptor %d", event.data.fd);
		loop->wakeups++;
	}
	OK(doca_pe_clear_notification(loop->pe, 0));
	while (doca_pe_progress(loop->pe) != 0)
		;
	return n > 0;
}

static void loopback_done(struct doca_urom_worker_cmd_task *task,
			  union doca_data task_user_data,
			  union doca_data ctx_user_data)
{
	struct loop *loop = task_user_data.ptr;
	struct loopback back;

	(void)ctx_user_data;
	OK(doca_task_get_status(doca_urom_worker_cmd_task_as_task(task)));
	CHECK(copy_response(task, &back, sizeof(back)) == sizeof(back), "a whole answer");
	loop->last = back.data;
	loop->completed++;
	OK(doca_urom_worker_cmd_task_release(task));
}

static void submit(struct doca_urom_worker *worker, uint64_t graph, struct loop *loop, uint64_t value)
{
	struct doca_urom_worker_cmd_task *task;
	struct doca_buf *payload;
	struct loopback *cmd;
	union doca_data data = {.ptr = loop};

	OK(doca_urom_worker_cmd_task_allocate_init(worker, graph, &task));
	doca_urom_worker_cmd_task_set_cb(task, loopback_done);
	doca_task_set_user_data(doca_urom_worker_cmd_task_as_task(task), data);
	payload = doca_urom_worker_cmd_task_get_payload(task);
	OK(doca_buf_get_data(payload, (void **)&cmd));
	cmd->type = 0;
	cmd->data = value;
	OK(doca_buf_set_data(payload, cmd, sizeof(*cmd)));
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
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

/* Turns of the loop until the context reaches `want`; how many turns it took. */
static unsigned long until_state(struct loop *loop, struct doca_ctx *ctx, enum doca_ctx_states want)
{
	enum doca_ctx_states state;
	unsigned long turns = 0;
	double deadline = seconds(CLOCK_MONOTONIC) + 30;

	for (;;) {
		OK(doca_ctx_get_state(ctx, &state));
		if (state == want)
			return turns;
		CHECK(seconds(CLOCK_MONOTONIC) < deadline, "state %d, waiting for %d", state, want);
		turn(loop, 10000);
		turns++;
	}
}

int main(void)
{
	struct loop loop = {0};
	struct doca_urom_service *service;
	struct doca_urom_worker *worker;
	struct doca_ctx *ctx;
	struct epoll_event event;
	doca_notification_handle_t handle, again;
	unsigned long turns, wakeups, idle_turns;
	uint64_t graph, i;
	double cpu, wall, start_wall;

	OK(doca_pe_create(&loop.pe));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_get_notification_handle(loop.pe, NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_request_notification(NULL));
	IS(DOCA_ERROR_INVALID_VALUE, doca_pe_clear_notification(NULL, 0));
	OK(doca_pe_get_notification_handle(loop.pe, &handle));
	OK(doca_pe_get_notification_handle(loop.pe, &again));
	CHECK(handle >= 0 && handle == again, "one handle: %d, %d", handle, again);

	loop.epoll = epoll_create1(EPOLL_CLOEXEC);
	CHECK(loop.epoll >= 0, "epoll_create1: %s", strerror(errno));
	memset(&event, 0, sizeof(event));
	event.events = EPOLLIN;
	event.data.fd = handle;
	CHECK(epoll_ctl(loop.epoll, EPOLL_CTL_ADD, handle, &event) == 0, "epoll_ctl: %s", strerror(errno));

	/* An engine with no context: nothing wakes it. */
	CHECK(!turn(&loop, 50), "an empty engine woke");

	OK(doca_urom_service_create(&service));
	OK(doca_pe_connect_ctx(loop.pe, doca_urom_service_as_ctx(service)));
	OK(doca_ctx_start(doca_urom_service_as_ctx(service)));
	graph = graph_id(service);

	OK(doca_urom_worker_create(&worker));
	ctx = doca_urom_worker_as_ctx(worker);
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(loop.pe, ctx));
	OK(doca_urom_worker_set_plugins(worker, graph));
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	until_state(&loop, ctx, DOCA_CTX_STATE_RUNNING);

	/* Idle: a second of waiting costs (next to) no CPU time, with few wake-ups. */
	wakeups = loop.wakeups;
	idle_turns = 0;
	cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
	start_wall = seconds(CLOCK_MONOTONIC);
	while ((wall = seconds(CLOCK_MONOTONIC) - start_wall) < 1.0) {
		turn(&loop, (int)((1.0 - wall) * 1000) + 1);
		idle_turns++;
	}
	cpu = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu;
	CHECK(cpu < 0.2, "%.3f s of CPU time in %.3f s of idle waiting (%lu turns)", cpu, wall, idle_turns);
	CHECK(loop.wakeups - wakeups < 20, "%lu wake-ups while idle", loop.wakeups - wakeups);
	CHECK(loop.completed == 0, "nothing completed");

	/* Each loopback wakes the loop. */
	wakeups = loop.wakeups;
	turns = 0;
	for (i = 0; i < LOOPBACKS; i++) {
		submit(worker, graph, &loop, 1000 + i);
		while (loop.completed < i + 1) {
			CHECK(turns < 100 * LOOPBACKS, "%lu turns for %lu loopbacks", turns, (unsigned long)i);
			/* Woken, never timed out: a completion ends every sleep. */
			CHECK(turn(&loop, 10000), "loopback %lu did not wake the loop", (unsigned long)i);
			turns++;
		}
		CHECK(loop.last == 1000 + i, "%lu came back for %lu", (unsigned long)loop.last,
		      (unsigned long)(1000 + i));
	}
	CHECK(loop.wakeups - wakeups <= 4 * LOOPBACKS, "%lu wake-ups for %d loopbacks",
	      loop.wakeups - wakeups, LOOPBACKS);

	/* Stopping completes through the loop too. */
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
	until_state(&loop, ctx, DOCA_CTX_STATE_IDLE);
	OK(doca_urom_worker_destroy(worker));
	OK(doca_ctx_stop(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(loop.pe));
	close(loop.epoll);
	printf("notify ok: %d loopbacks, %lu wake-ups in all, %lu turns idle, %.3f s CPU idle\n",
	       LOOPBACKS, loop.wakeups, idle_turns, cpu);
	return 0;
}
