//! Every limit of the three programs in one place: message lengths, requests in flight,
//! threads, how requests are batched into frames, buffer sizes.

use urom_transport::shm::MAX_MAPPING_LEN;
use urom_wire::MaxMsgSize;
use urom_wire::gpu::CLIENT_HEADER_LEN;

/// The largest `--max-message-length`: a message, header included, must fit the transport's
/// largest frame. It works with any `--max-concurrent-messages` (see [`MAX_CHANNEL_SLOTS`]).
pub const MAX_MESSAGE_LENGTH: u32 = MaxMsgSize::MAX - CLIENT_HEADER_LEN as u32;

/// Frame slots per direction of a data connection with `max_concurrent` requests in flight:
/// one per request (rounded up to a power of two), at least 2, at most [`MAX_CHANNEL_SLOTS`].
/// A client whose requests find every slot taken waits, as it does for an in-flight entry.
pub const fn channel_slots(max_concurrent: u32) -> u32 {
    let slots = max_concurrent.next_power_of_two();
    if slots < 2 {
        2
    } else if slots > MAX_CHANNEL_SLOTS {
        MAX_CHANNEL_SLOTS
    } else {
        slots
    }
}

/// Bytes of a data connection's mapping besides its slots: the header and two ring control
/// blocks (urom-core's `transport::shm::layout` offset table).
const MAPPING_FIXED: u64 = 640;
/// Bytes of a slot besides its frame, before it is rounded up to [`SLOT_ALIGN`].
const SLOT_HEADER: u64 = 8;
/// Slots are a whole number of these bytes.
const SLOT_ALIGN: u64 = 128;

/// The bytes one data connection maps for frames of up to `frame` bytes and
/// `channel_slots(max_concurrent)` slots per direction.
pub const fn mapping_len(frame: u32, max_concurrent: u32) -> u64 {
    let stride = (SLOT_HEADER + frame as u64).next_multiple_of(SLOT_ALIGN);
    MAPPING_FIXED + 2 * channel_slots(max_concurrent) as u64 * stride
}

/// The default `--max-concurrent-messages` of server and orchestrator.
pub const DEFAULT_MAX_CONCURRENT: u32 = 128;
/// The largest `--max-concurrent-messages` of server and orchestrator: the transport's largest
/// ring.
pub const MAX_CONCURRENT: u32 = urom_transport::shm::MAX_SLOTS;

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
/// Most frame slots per direction of a data connection. A frame holds many requests, up to
/// [`BATCH_BYTES`], so this many keep a thread busy; and the ring's producer writes every slot
/// in turn, so more slots only spread the same frames over more memory: 32 frames of 64-byte
/// requests keep both rings of a connection (about 620 KiB) in the CPU's cache, where 128
/// spilled it (measured: CPU per request 1.7x a bare TCP server against 2.0x, 512 requests in
/// flight per thread). It also leaves room in a mapping for frames of the largest message.
pub const MAX_CHANNEL_SLOTS: u32 = 32;

// The largest message works with any `--max-concurrent-messages`.
const _: () = assert!(mapping_len(MaxMsgSize::MAX, MAX_CONCURRENT) <= MAX_MAPPING_LEN);

/// Clients the server accepted that wait for their data-path thread to take them, per thread;
/// a client beyond them is refused (closed at once) with a warning.
pub const MAX_WAITING_CLIENTS: usize = 1024;
/// The read buffer of a TCP connection: the client's, per thread, at least this and at least
/// two largest messages; the server's, per client, this when it connects, doubled as its
/// messages need, up to two largest messages.
pub const MIN_READ_BUFFER: usize = 64 * 1024;
/// The server's write buffer per client when it connects, doubled as the responses it has in
/// flight need, up to `--max-concurrent-messages` largest responses.
pub const MIN_WRITE_BUFFER: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_requests_in_flight_up_to_the_cap() {
        for (max_concurrent, slots) in [(1, 2), (2, 2), (3, 4), (32, 32), (33, 32), (128, 32)] {
            assert_eq!(channel_slots(max_concurrent), slots, "{max_concurrent}");
        }
        assert_eq!(channel_slots(MAX_CONCURRENT), MAX_CHANNEL_SLOTS);
    }
}
