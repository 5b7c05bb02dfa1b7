/*
 * urom_coll.h: urom's collective offload from C.
 *
 * The ranks of a node hand MPI-style collectives to one urom worker, which moves and reduces
 * the data in buffers the ranks registered, while the ranks compute. The shape is UCC's:
 *
 *   urom_coll_context_create()   collective over the context's out-of-band group (a node's
 *                                ranks): connects to the urom service; the group's first rank
 *                                starts the node's worker, the others attach to it
 *   urom_coll_team_create()      collective over the team's out-of-band group (any ranks of the
 *                                node, in team-rank order)
 *   urom_coll_mem_alloc()        memory urom allocates and shares with the worker
 *   urom_coll_mem_register()     an existing buffer, reached by cross-memory attach
 *   urom_coll_init()             a persistent collective over registered buffers
 *   urom_coll_rebind()           this rank's buffers of it replaced (no other rank involved)
 *   urom_coll_start() / urom_coll_test() / urom_coll_wait()   any number of times
 *   urom_coll_free(), urom_coll_mem_free(), urom_coll_team_destroy(),
 *   urom_coll_context_destroy()
 *
 * Rules (MPI's): every rank of a team initialises its collectives in the same order and starts
 * them in the same order. A collective's buffers belong to the worker while it runs. A context
 * and everything made from it are used from the thread that created the context
 * (UROM_ERR_WRONG_THREAD otherwise); completion callbacks run from urom_coll_test(),
 * urom_coll_wait() and urom_coll_context_progress() and must not call into the library.
 *
 * Errors: every function returns a urom_status_t; NULL or destroyed handles give
 * UROM_ERR_INVALID_PARAM. urom_status_string() names a status; urom_coll_last_error() says, for
 * the calling thread, what the last failed call failed on (which rank, which reason).
 *
 * Link with -lurom_coll (liburom_coll.so). The service is found as urom's host API finds it:
 * the params' service_socket, else $UROM_SERVICE_SOCKET, else the line for this host in
 * $DOCA_UROM_SERVICE_FILE, else the default socket.
 */
#ifndef UROM_COLL_H_
#define UROM_COLL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The version of this header and library: major * 1000 + minor. */
#define UROM_COLL_API_VERSION 1000

/** What a call gave. Negative values are errors. */
typedef enum urom_status {
    UROM_OK = 0,                  /**< done */
    UROM_INPROGRESS = 1,          /**< a collective (or out-of-band request) still runs */
    UROM_ERR_INVALID_PARAM = -1,  /**< a NULL or destroyed handle, or a wrong argument */
    UROM_ERR_NO_SERVICE = -2,     /**< the urom service cannot be reached on some rank */
    UROM_ERR_NOT_SUPPORTED = -3,  /**< e.g. a team spanning nodes */
    UROM_ERR_NO_MEMORY = -4,      /**< shared memory or an allocation failed */
    UROM_ERR_BUSY = -5,           /**< the collective runs: wait for it first */
    UROM_ERR_TIMED_OUT = -6,      /**< the worker did not answer a set-up step in time */
    UROM_ERR_OOB = -7,            /**< the out-of-band allgather failed */
    UROM_ERR_WORKER = -8,         /**< the node's worker died or its connection failed */
    UROM_ERR_FAILED = -9,         /**< the collective failed (a rank died, arguments disagree) */
    UROM_ERR_CROSS_MEMORY = -10,  /**< the kernel or a container forbids cross-memory attach */
    UROM_ERR_WRONG_THREAD = -11,  /**< called from another thread than the context's */
    UROM_ERR_INTERNAL = -12       /**< a bug in the library (it caught a panic) */
} urom_status_t;

/** A short, constant description of `status` ("UROM_OK: ..."); never NULL. */
const char *urom_status_string(urom_status_t status);

/** What the calling thread's last failed call failed on (for example "rank 2: the rank's
 *  process exited (DOCA_ERROR_CONNECTION_ABORTED)"); "" when none failed. Valid until the
 *  thread's next call into the library. */
const char *urom_coll_last_error(void);

/** A non-blocking allgather among the members of a group, provided by the caller (UCC's
 *  ucc_oob_coll_t): gathers `msglen` bytes of `sbuf` from every member into `rbuf` (member i's
 *  bytes at i * msglen) and stores a request in `*req`. */
typedef struct urom_coll_oob {
    /** Starts the allgather; UROM_OK, or an error. */
    urom_status_t (*allgather)(void *sbuf, void *rbuf, size_t msglen, void *coll_info,
                               void **req);
    /** UROM_OK once `req` completed, UROM_INPROGRESS before, anything else fails it. */
    urom_status_t (*req_test)(void *req);
    /** Releases `req` (complete or not). */
    urom_status_t (*req_free)(void *req);
    /** Passed to `allgather`. */
    void *coll_info;
    /** How many members the group has. */
    uint32_t n_oob_eps;
    /** This member, 0 .. n_oob_eps - 1. */
    uint32_t oob_ep;
} urom_coll_oob_t;

/** A connection to the urom service and to the node's worker. */
typedef struct urom_coll_context *urom_coll_context_h;
/** Ranks of one node whose collectives the node's worker runs. */
typedef struct urom_coll_team *urom_coll_team_h;
/** Memory registered with a team. */
typedef struct urom_coll_buffer *urom_coll_buffer_h;
/** A persistent collective. */
typedef struct urom_coll_req *urom_coll_req_h;

/** How to create a context. */
typedef struct urom_coll_context_params {
    /** The node's ranks (required). Their first member starts the node's worker. */
    urom_coll_oob_t oob;
    /** The service's socket; NULL for the default search (see the top of this file). */
    const char *service_socket;
} urom_coll_context_params_t;

/** Creates a context. Collective over `params->oob`: every member calls it; when any member
 *  cannot reach the service, every member gets UROM_ERR_NO_SERVICE. */
urom_status_t urom_coll_context_create(const urom_coll_context_params_t *params,
                                       urom_coll_context_h *context);

/** Progresses the context once: completions arrive, callbacks run. */
urom_status_t urom_coll_context_progress(urom_coll_context_h context);

/** Destroys the context handle; the connection lives on while a team made from it lives. */
urom_status_t urom_coll_context_destroy(urom_coll_context_h context);

/** How to create a team. */
typedef struct urom_coll_team_params {
    /** The team's members, in team-rank order (required); all on this node. */
    urom_coll_oob_t oob;
} urom_coll_team_params_t;

/** Creates a team. Collective over `params->oob` (like MPI_Comm_create); team rank is the
 *  out-of-band member number. UROM_ERR_NOT_SUPPORTED when the members do not share one
 *  worker (they span nodes). */
urom_status_t urom_coll_team_create(urom_coll_context_h context,
                                    const urom_coll_team_params_t *params,
                                    urom_coll_team_h *team);

/** This rank in the team, and the team's size (either pointer may be NULL). */
urom_status_t urom_coll_team_query(urom_coll_team_h team, uint32_t *rank, uint32_t *size);

/** The worker's process id (to watch it, or, in tests, to kill it). */
urom_status_t urom_coll_team_worker_pid(urom_coll_team_h team, uint32_t *pid);

/** Destroys this rank's handle of the team. Buffers and collectives keep what they need. */
urom_status_t urom_coll_team_destroy(urom_coll_team_h team);

/** Allocates `len` bytes shared with the worker (zeroed) and registers them; `*ptr` is where
 *  this process reads and writes them, valid until urom_coll_mem_free(). Like MPI_Alloc_mem. */
urom_status_t urom_coll_mem_alloc(urom_coll_team_h team, size_t len, void **ptr,
                                  urom_coll_buffer_h *buffer);

/** Registers `len` bytes of this process at `addr`; the worker reaches them by cross-memory
 *  attach (process_vm_readv/writev; PR_SET_PTRACER is granted to the worker where Yama's
 *  ptrace_scope is 1). UROM_ERR_CROSS_MEMORY, with the reason in urom_coll_last_error(), where
 *  the kernel or a container forbids it.
 *
 *  Contract: the memory stays mapped and writable until urom_coll_mem_free() and the end of
 *  every collective over it; while a collective using it runs, the program neither reads nor
 *  writes it. */
urom_status_t urom_coll_mem_register(urom_coll_team_h team, void *addr, size_t len,
                                     urom_coll_buffer_h *buffer);

/** Releases a buffer handle; the registration ends once no collective uses it. */
urom_status_t urom_coll_mem_free(urom_coll_buffer_h buffer);

/** Collectives (MPI 4.0 semantics). */
typedef enum urom_coll_type {
    UROM_COLL_BARRIER = 0,
    UROM_COLL_BCAST = 1,
    UROM_COLL_REDUCE = 2,
    UROM_COLL_ALLREDUCE = 3,
    UROM_COLL_ALLGATHER = 4,
    UROM_COLL_ALLGATHERV = 5,
    UROM_COLL_ALLTOALL = 6,
    UROM_COLL_ALLTOALLV = 7,
    UROM_COLL_REDUCE_SCATTER_BLOCK = 8,
    UROM_COLL_GATHER = 9,
    UROM_COLL_SCATTER = 10
} urom_coll_type_t;

/** Element types. */
typedef enum urom_datatype {
    UROM_DT_INT8 = 0,
    UROM_DT_INT16 = 1,
    UROM_DT_INT32 = 2,
    UROM_DT_INT64 = 3,
    UROM_DT_UINT8 = 4,
    UROM_DT_UINT16 = 5,
    UROM_DT_UINT32 = 6,
    UROM_DT_UINT64 = 7,
    UROM_DT_FLOAT16 = 8,
    UROM_DT_BFLOAT16 = 9,
    UROM_DT_FLOAT32 = 10,
    UROM_DT_FLOAT64 = 11
} urom_datatype_t;

/** Reductions; the bitwise and logical ones for integers only. */
typedef enum urom_op {
    UROM_OP_SUM = 0,
    UROM_OP_PROD = 1,
    UROM_OP_MIN = 2,
    UROM_OP_MAX = 3,
    UROM_OP_BAND = 4,
    UROM_OP_BOR = 5,
    UROM_OP_BXOR = 6,
    UROM_OP_LAND = 7,
    UROM_OP_LOR = 8,
    UROM_OP_LXOR = 9
} urom_op_t;

/** `flags`: this rank's input is in the destination buffer (MPI_IN_PLACE). */
#define UROM_COLL_FLAG_IN_PLACE 1u

/** A part of a registered buffer. NULL `buffer`: none (a zero count, in place, a non-root). */
typedef struct urom_coll_buffer_info {
    urom_coll_buffer_h buffer;
    /** Where the collective's data starts, in elements of the collective's datatype. */
    uint64_t offset;
    /** A count in elements: the send count for `src`, the receive count (per rank, for
     *  allgather, alltoall, gather, scatter, reduce-scatter-block) for `dst`. */
    uint64_t count;
} urom_coll_buffer_info_t;

/** A collective, described as MPI describes it. */
typedef struct urom_coll_args {
    urom_coll_type_t coll_type;
    urom_datatype_t datatype;
    urom_op_t op;             /**< reductions only */
    uint32_t root;            /**< rooted collectives only */
    uint32_t flags;           /**< UROM_COLL_FLAG_IN_PLACE */
    urom_coll_buffer_info_t src; /**< send buffer; for bcast the buffer */
    urom_coll_buffer_info_t dst; /**< receive buffer */
    /** v-variants: allgatherv recvcounts[n] ++ displs[n]; alltoallv sendcounts[n] ++
     *  sdispls[n] ++ recvcounts[n] ++ rdispls[n] (elements); NULL otherwise. */
    const uint64_t *counts;
    /** How many words `counts` has (2n or 4n). */
    size_t counts_len;
} urom_coll_args_t;

/** Sets up a persistent collective (collective over the team; a round trip to the worker). */
urom_status_t urom_coll_init(urom_coll_team_h team, const urom_coll_args_t *args,
                             urom_coll_req_h *req);

/** Replaces this rank's part of a persistent collective that does not run: its buffers,
 *  offsets, counts, flags and v-variant words become `args`' (type, datatype, operation and
 *  root are expected to stay). This rank alone: no other rank takes part (a round trip to the
 *  worker), and the others keep their parts; the next start checks that all parts agree, as
 *  after urom_coll_init(). UROM_ERR_BUSY while it runs. When the worker refuses the new part,
 *  the collective keeps none for this rank and its next start fails. */
urom_status_t urom_coll_rebind(urom_coll_req_h req, const urom_coll_args_t *args);

/** Starts it (allocates nothing); UROM_ERR_BUSY while it runs, UROM_ERR_WORKER once the worker
 *  is gone. */
urom_status_t urom_coll_start(urom_coll_req_h req);

/** Progresses once: UROM_INPROGRESS while it runs, then UROM_OK or the error it failed with
 *  (every failure completes it, once, on every member). UROM_OK for one never started. */
urom_status_t urom_coll_test(urom_coll_req_h req);

/** Progresses until it completed; UROM_OK or the error it failed with. */
urom_status_t urom_coll_wait(urom_coll_req_h req);

/** A completion callback: `status` is UROM_OK or the error. Runs from the context's progress;
 *  it must not call into the library. */
typedef void (*urom_coll_callback_t)(void *arg, urom_status_t status);

/** Runs `cb(arg, status)` at each completion (NULL `cb`: none). */
urom_status_t urom_coll_set_callback(urom_coll_req_h req, urom_coll_callback_t cb, void *arg);

/** Frees it: UROM_ERR_BUSY while it runs. */
urom_status_t urom_coll_free(urom_coll_req_h req);

#ifdef __cplusplus
}
#endif

#endif /* UROM_COLL_H_ */
