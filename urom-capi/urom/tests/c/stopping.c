/*
 * How a worker context leaves RUNNING, seen through DOCA's state-changed callback.
 *
 *   stopping paused DAEMON_PID: doca_ctx_stop() while the daemon is paused (SIGSTOP) cannot have
 *     the daemon's answer, yet neither it nor doca_pe_progress() waits for it: the context is
 *     STOPPING, progress returns at once, again and again; once the daemon goes on (SIGCONT),
 *     progress brings the context to IDLE (callbacks RUNNING -> STOPPING -> IDLE).
 *   stopping killed DAEMON_PID: the worker process is killed (SIGKILL); without any call of the
 *     program's, progress reports it: RUNNING -> STOPPING -> IDLE through the callback, a task
 *     in flight completes with DOCA_ERROR_NOT_CONNECTED, and the worker can start again.
 *
 * Exits 0 and prints "stopping ok: MODE" when every check passed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <doca_buf.h>
#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

/* The state changes the callback saw. */
struct changes {
	int count;
	enum doca_ctx_states prev[16];
	enum doca_ctx_states next[16];
};

static void state_changed(const union doca_data user_data,
			  struct doca_ctx *ctx,
			  enum doca_ctx_states prev_state,
			  enum doca_ctx_states next_state)
{
	struct changes *changes = user_data.ptr;
	enum doca_ctx_states now;

	OK(doca_ctx_get_state(ctx, &now));
	CHECK(now == next_state, "reported %d while in %d", next_state, now);
	CHECK(changes->count < 16, "too many state changes");
	changes->prev[changes->count] = prev_state;
	changes->next[changes->count] = next_state;
	changes->count++;
}

/* The last change is prev -> next. */
static void saw(const struct changes *changes, int index, enum doca_ctx_states prev, enum doca_ctx_states next)
{
	CHECK(changes->count > index, "%d changes, expected change %d", changes->count, index);
	CHECK(changes->prev[index] == prev && changes->next[index] == next, "change %d: %d -> %d, expected %d -> %d",
	      index, changes->prev[index], changes->next[index], prev, next);
}

static double now(void)
{
	struct timespec ts;

	CHECK(clock_gettime(CLOCK_MONOTONIC, &ts) == 0, "clock_gettime: %s", strerror(errno));
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Progresses until the context is in `want`, for 30 s at most. */
static void progress_until(struct doca_pe *pe, struct doca_ctx *ctx, enum doca_ctx_states want)
{
	enum doca_ctx_states state;
	double deadline = now() + 30;

	for (;;) {
		OK(doca_ctx_get_state(ctx, &state));
		if (state == want)
			return;
		CHECK(now() < deadline, "state %d, waiting for %d", state, want);
		doca_pe_progress(pe);
		usleep(100);
	}
}

static uint64_t plugin_id(struct doca_urom_service *service, const char *name)
{
	const struct doca_urom_service_plugin_info *plugins;
	size_t count, i;

	OK(doca_urom_service_get_plugins_list(service, &plugins, &count));
	for (i = 0; i < count; i++)
		if (strcmp(plugins[i].plugin_name, name) == 0)
			return plugins[i].id;
	CHECK(0, "the service does not offer %s", name);
	return 0;
}

/* Reads /proc/PID/NAME into buf (NUL-terminated); its length, or -1 when it cannot be read. */
static long read_proc(pid_t pid, const char *name, char *buf, size_t size)
{
	char path[64];
	FILE *file;
	size_t len;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, name);
	file = fopen(path, "r");
	if (file == NULL)
		return -1;
	len = fread(buf, 1, size - 1, file);
	fclose(file);
	buf[len] = 0;
	return (long)len;
}

/* The process of worker `id`: the daemon's child running urom-worker with "--id ID". */
static pid_t worker_pid(pid_t daemon, uint64_t id)
{
	char buf[4096], want[32];
	DIR *proc = opendir("/proc");
	struct dirent *entry;
	pid_t found = 0;

	CHECK(proc != NULL, "opendir /proc: %s", strerror(errno));
	snprintf(want, sizeof(want), "%lu", (unsigned long)id);
	while (found == 0 && (entry = readdir(proc)) != NULL) {
		pid_t pid = (pid_t)atoi(entry->d_name);
		long read;
		size_t len, at;
		int parent = 0, is_worker = 0, has_id = 0;
		const char *close_paren;

		if (pid <= 0 || read_proc(pid, "stat", buf, sizeof(buf)) < 0)
			continue;
		close_paren = strrchr(buf, ')');
		if (close_paren == NULL || sscanf(close_paren + 1, " %*c %d", &parent) != 1 || parent != daemon)
			continue;
		read = read_proc(pid, "cmdline", buf, sizeof(buf));
		if (read < 0)
			continue;
		len = (size_t)read;
		/* NUL-separated arguments: the program, then --id ID among the rest. */
		is_worker = strstr(buf, "urom-worker") != NULL;
		for (at = 0; at < len; at += strlen(buf + at) + 1)
			if (strcmp(buf + at, "--id") == 0 && at + strlen(buf + at) + 1 < len &&
			    strcmp(buf + at + strlen(buf + at) + 1, want) == 0)
				has_id = 1;
		if (is_worker && has_id)
			found = pid;
	}
	closedir(proc);
	return found;
}

static doca_error_t later_status;
static int later_done;

static void later_cb(struct doca_urom_worker_cmd_task *task, union doca_data task_user_data, union doca_data ctx_user_data)
{
	(void)task_user_data;
	(void)ctx_user_data;
	later_status = doca_task_get_status(doca_urom_worker_cmd_task_as_task(task));
	later_done++;
	OK(doca_urom_worker_cmd_task_release(task));
}

/* Sends the faulty plugin a command it answers from its next progress; it may still be in
 * flight when the worker dies. */
static void submit_text(struct doca_urom_worker *worker, uint64_t plugin, const char *text)
{
	struct doca_urom_worker_cmd_task *task;
	struct doca_buf *payload;
	void *data;

	OK(doca_urom_worker_cmd_task_allocate_init(worker, plugin, &task));
	doca_urom_worker_cmd_task_set_cb(task, later_cb);
	payload = doca_urom_worker_cmd_task_get_payload(task);
	OK(doca_buf_get_data(payload, &data));
	memcpy(data, text, strlen(text));
	OK(doca_buf_set_data(payload, data, strlen(text)));
	OK(doca_task_submit(doca_urom_worker_cmd_task_as_task(task)));
}

static void start_worker(struct doca_pe *pe, struct doca_ctx *ctx)
{
	IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_start(ctx));
	progress_until(pe, ctx, DOCA_CTX_STATE_RUNNING);
}

int main(int argc, char **argv)
{
	struct changes changes = {0};
	union doca_data data = {.ptr = &changes};
	struct doca_pe *pe;
	struct doca_urom_service *service;
	struct doca_urom_worker *worker;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	uint64_t faulty, id;
	pid_t daemon, pid;
	double slowest = 0, t;
	int i, paused;

	CHECK(argc == 3 && (strcmp(argv[1], "paused") == 0 || strcmp(argv[1], "killed") == 0),
	      "usage: stopping paused|killed DAEMON_PID");
	paused = strcmp(argv[1], "paused") == 0;
	daemon = (pid_t)atoi(argv[2]);
	/* A blocking stop would hang the program: end it instead. */
	alarm(120);

	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	OK(doca_pe_connect_ctx(pe, doca_urom_service_as_ctx(service)));
	OK(doca_ctx_start(doca_urom_service_as_ctx(service)));
	faulty = plugin_id(service, "worker_faulty");

	OK(doca_urom_worker_create(&worker));
	ctx = doca_urom_worker_as_ctx(worker);
	OK(doca_urom_worker_set_service(worker, service));
	OK(doca_pe_connect_ctx(pe, ctx));
	OK(doca_urom_worker_set_plugins(worker, faulty));
	OK(doca_ctx_set_user_data(ctx, data));
	OK(doca_ctx_set_state_changed_cb(ctx, state_changed));
	start_worker(pe, ctx);
	saw(&changes, 0, DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING);
	saw(&changes, 1, DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING);
	OK(doca_urom_worker_get_id(worker, &id));

	if (paused) {
		CHECK(kill(daemon, SIGSTOP) == 0, "pausing the daemon: %s", strerror(errno));
		IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
		IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
		/* Half a second of progress calls, none of which may wait for the paused daemon. */
		for (i = 0; i < 500; i++) {
			t = now();
			doca_pe_progress(pe);
			t = now() - t;
			if (t > slowest)
				slowest = t;
			usleep(1000);
		}
		OK(doca_ctx_get_state(ctx, &state));
		CHECK(state == DOCA_CTX_STATE_STOPPING, "state %d while the daemon is paused", state);
		CHECK(changes.count == 3, "%d state changes", changes.count);
		saw(&changes, 2, DOCA_CTX_STATE_RUNNING, DOCA_CTX_STATE_STOPPING);
		/* A generous bound: a call that waited for the daemon would not return at all. */
		CHECK(slowest < 0.25, "a progress call took %.3f s", slowest);
		CHECK(kill(daemon, SIGCONT) == 0, "resuming the daemon: %s", strerror(errno));
		progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
		saw(&changes, 3, DOCA_CTX_STATE_STOPPING, DOCA_CTX_STATE_IDLE);
	} else {
		pid = worker_pid(daemon, id);
		CHECK(pid > 0, "worker %lu's process among the daemon's children", (unsigned long)id);
		/* The plugin holds this one until its next progress: likely in flight at the kill. */
		submit_text(worker, faulty, "later");
		CHECK(kill(pid, SIGKILL) == 0, "killing the worker: %s", strerror(errno));
		/* No call of the program's but progress: the failure is reported. */
		progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
		CHECK(changes.count == 4, "%d state changes", changes.count);
		saw(&changes, 2, DOCA_CTX_STATE_RUNNING, DOCA_CTX_STATE_STOPPING);
		saw(&changes, 3, DOCA_CTX_STATE_STOPPING, DOCA_CTX_STATE_IDLE);
		CHECK(later_done == 1, "the task completed %d times", later_done);
		CHECK(later_status == DOCA_SUCCESS || later_status == DOCA_ERROR_NOT_CONNECTED,
		      "the task completed with %s", doca_error_get_name(later_status));
		IS(DOCA_ERROR_BAD_STATE, doca_ctx_stop(ctx));
		/* The context is usable again: a fresh worker starts and answers. */
		OK(doca_urom_worker_set_id(worker, DOCA_UROM_WORKER_ID_ANY));
		start_worker(pe, ctx);
		submit_text(worker, faulty, "echo");
		while (later_done < 2)
			doca_pe_progress(pe);
		OK(later_status);
		IS(DOCA_ERROR_IN_PROGRESS, doca_ctx_stop(ctx));
		progress_until(pe, ctx, DOCA_CTX_STATE_IDLE);
	}

	OK(doca_urom_worker_destroy(worker));
	OK(doca_ctx_stop(doca_urom_service_as_ctx(service)));
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
	printf("stopping ok: %s, %d state changes\n", argv[1], changes.count);
	return 0;
}
