//! Every limit of the three programs in one place: message lengths, requests in flight,
//! threads, how requests are batched into frames, buffer sizes.

use urom_wire::MaxMsgSize;
use urom_wire::gpu::CLIENT_HEADER_LEN;

/// The largest `--max-message-length`: a message, header included, must fit the transport's
/// largest frame.
pub const MAX_MESSAGE_LENGTH: u32 = MaxMsgSize::MAX - CLIENT_HEADER_LEN as u32;

/// The default `--max-concurrent-messages` of server and orchestrator.
pub const DEFAULT_MAX_CONCURRENT: u32 = 128;
/// The largest `--max-concurrent-messages` of server and orchestrator: the transport's largest
/// ring.
pub const MAX_CONCURRENT: u32 = urom_core::transport::shm::MAX_SLOTS;

/// Most orchestrator processor threads (`-t`), and so most server data-path threads that an
/// orchestrator can serve; the CUDA kernel runs one block of one warp per thread.
pub const MAX_PROCESSOR_THREADS: u32 = 1024;
/// Most client threads (`-t`).
pub const MAX_CLIENT_THREADS: u32 = 4096;
/// Most requests a client thread keeps in flight (`--max-concurrent-messages` of the client).
pub const MAX_CLIENT_CONCURRENT: u32 = 65536;

/// Bytes of requests (or responses) one data frame carries at most, unless one message is
/// longer.
pub const BATCH_BYTES: usize = 16 * 1024;
/// Most frame slots per direction of a data connection (frames hold many messages, so a ring
/// of this many holds far more messages than any sane `--max-concurrent-messages`).
pub const MAX_CHANNEL_SLOTS: u32 = 1024;

/// Clients the server accepted that wait for their data-path thread to take them, per thread;
/// a client beyond them is refused (closed at once) with a warning.
pub const MAX_WAITING_CLIENTS: usize = 1024;
/// The read buffer of a TCP connection (the server's, per client; the client's, per thread):
/// at least this, and at least two largest messages.
pub const MIN_READ_BUFFER: usize = 64 * 1024;
