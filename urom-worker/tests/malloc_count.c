/*
 * Counts every allocation of the process it is preloaded into (LD_PRELOAD), including those of
 * plugins and of the C library, and writes the count at exit to $UROM_MALLOC_COUNT_FILE.
 * Allocations are forwarded to the C library's own allocator.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void *ptr);

static atomic_ulong allocations;

void *malloc(size_t size)
{
	atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
	return __libc_malloc(size);
}

void *calloc(size_t count, size_t size)
{
	atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
	return __libc_calloc(count, size);
}

void *realloc(void *ptr, size_t size)
{
	atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
	return __libc_realloc(ptr, size);
}

void *memalign(size_t alignment, size_t size)
{
	atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
	return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size)
{
	return memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size)
{
	void *ptr = memalign(alignment, size);

	if (ptr == NULL)
		return ENOMEM;
	*out = ptr;
	return 0;
}

void free(void *ptr)
{
	__libc_free(ptr);
}

__attribute__((destructor)) static void report(void)
{
	unsigned long count = atomic_load(&allocations);
	const char *path = getenv("UROM_MALLOC_COUNT_FILE");
	FILE *out;

	if (path == NULL)
		return;
	out = fopen(path, "w");
	if (out == NULL)
		return;
	fprintf(out, "%lu\n", count);
	fclose(out);
}
