/*
 * A service that cannot be used: doca_ctx_start() of the service returns EXPECTED (a DOCA
 * status name) and leaves it idle, twice in a row (the failure changes nothing), after which it
 * is destroyed. Exits 0 and prints "start failed: EXPECTED" when every check passed.
 *
 *   start_fails EXPECTED
 */
#include <stdio.h>
#include <string.h>

#include <doca_ctx.h>
#include <doca_error.h>
#include <doca_pe.h>
#include <doca_urom.h>

#include "check.h"

int main(int argc, char **argv)
{
	struct doca_pe *pe;
	struct doca_urom_service *service;
	struct doca_ctx *ctx;
	enum doca_ctx_states state;
	doca_error_t result;
	int attempt;

	CHECK(argc == 2, "usage: start_fails EXPECTED");
	OK(doca_pe_create(&pe));
	OK(doca_urom_service_create(&service));
	ctx = doca_urom_service_as_ctx(service);
	OK(doca_pe_connect_ctx(pe, ctx));
	for (attempt = 0; attempt < 2; attempt++) {
		result = doca_ctx_start(ctx);
		CHECK(strcmp(doca_error_get_name(result), argv[1]) == 0, "the start gave %s, expected %s",
		      doca_error_get_name(result), argv[1]);
		OK(doca_ctx_get_state(ctx, &state));
		CHECK(state == DOCA_CTX_STATE_IDLE, "the service stays idle, not in state %d", (int)state);
	}
	OK(doca_urom_service_destroy(service));
	OK(doca_pe_destroy(pe));
	printf("start failed: %s\n", argv[1]);
	return 0;
}
