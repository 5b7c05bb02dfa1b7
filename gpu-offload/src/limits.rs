//! Every limit of the three programs in one place: message lengths, requests in flight,
//! threads, how requests are batched into frames, buffer sizes.

use urom_core::transport::shm::MAX_MAPPING_LEN;
use urom_wire::MaxMsgSize;
use urom_wire::gpu::CLIENT_HEADER_LEN;

/// The largest `--max-message-length` the parser takes: a message, header included, must fit
/// the transport's largest frame. With many requests in flight the largest that works is less:
/// see [`max_message_length_for`].
pub const MAX_MESSAGE_LENGTH: u32 = MaxMsgSize::MAX - CLIENT_HEADER_LEN as u32;

/// Frame slots per direction of a data connection with `max_concurrent` requests in flight:
/// one per request (rounded up to a power of two), at least 2, at most [`MAX_CHANNEL_SLOTS`].
pub fn channel_slots(max_concurrent: u32) -> u32 {
    max_concurrent
        .next_power_of_two()
        .clamp(2, MAX_CHANNEL_SLOTS)
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
pub fn mapping_len(frame: u32, max_concurrent: u32) -> u64 {
    let stride = (SLOT_HEADER + u64::from(frame)).next_multiple_of(SLOT_ALIGN);
    MAPPING_FIXED + 2 * u64::from(channel_slots(max_concurrent)) * stride
}

/// The largest `--max-message-length` (payload bytes, headers excluded) that works with
/// `max_concurrent` requests in flight: a frame holds at least one largest message, each data
/// connection has [`channel_slots`] frames per direction, and its mapping may be at most
/// [`MAX_MAPPING_LEN`] bytes.
pub fn max_message_length_for(max_concurrent: u32) -> u32 {
    let slots = u64::from(channel_slots(max_concurrent));
    let stride = (MAX_MAPPING_LEN - MAPPING_FIXED) / (2 * slots) / SLOT_ALIGN * SLOT_ALIGN;
    let frame = (stride - SLOT_HEADER).min(u64::from(MaxMsgSize::MAX));
    (frame as u32 - CLIENT_HEADER_LEN as u32).min(MAX_MESSAGE_LENGTH)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_message_length_fills_a_mapping_and_one_byte_more_overflows_it() {
        // Measured: 8388460 runs with 128 in flight, 8388461 is refused by the transport.
        assert_eq!(max_message_length_for(128), 8_388_460);
        assert_eq!(max_message_length_for(32), MAX_MESSAGE_LENGTH);
        // The README's table.
        for (max_concurrent, largest) in [
            (1, MAX_MESSAGE_LENGTH),
            (33, 16_777_068),
            (64, 16_777_068),
            (65, 8_388_460),
            (129, 4_194_156),
            (257, 2_097_004),
            (513, 1_048_428),
            (MAX_CONCURRENT, 1_048_428),
        ] {
            assert_eq!(max_message_length_for(max_concurrent), largest);
        }
        assert!(mapping_len(MaxMsgSize::MAX, 32) <= MAX_MAPPING_LEN);
        for max_concurrent in [1, 2, 33, 64, 100, 128, 1000, 1024, MAX_CONCURRENT] {
            let largest = max_message_length_for(max_concurrent);
            let frame = |len: u32| (len + CLIENT_HEADER_LEN as u32).max(BATCH_BYTES as u32);
            assert!(mapping_len(frame(largest), max_concurrent) <= MAX_MAPPING_LEN);
            if largest < MAX_MESSAGE_LENGTH {
                assert!(mapping_len(frame(largest + 1), max_concurrent) > MAX_MAPPING_LEN);
            }
        }
    }
}
