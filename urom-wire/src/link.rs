//! Bodies exchanged between the daemon and each worker it spawned, over the socket the worker
//! got as its standard input (`--daemon-link`).
//!
//! The daemon asks ([`LinkMessage::CountersRequest`], empty body) and the worker answers with
//! the counters it last published ([`CounterReport`]); the reply carries the request's
//! sequence number. Frames on the link are at most [`LINK_MAX_MSG_SIZE`] bytes, whatever the
//! service's maximum message size.
//!
//! ```text
//! CountersReply  0 WorkerCounters (72 bytes, see crate::report)
//!                72 u32 count | 76 u32 reserved | 80 count x (i32 status, u32 reserved, u64 count)
//! ```

use static_assertions::assert_eq_size;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::codec::{Message, count_u32, no_trailing, prefix, put, reserved_zero};
use crate::report::{COUNTERS_LEN, ErrorEntry, WorkerCounters};
use crate::{DecodeError, EncodeError, List, MaxMsgSize};

/// The largest frame on a daemon link: room for a report with an entry for every status.
pub const LINK_MAX_MSG_SIZE: MaxMsgSize = MaxMsgSize::DEFAULT;

message_family! {
    /// Every body that travels on a daemon link.
    pub enum LinkMessage<'a> {
        /// What are your counters?
        CountersRequest,
        /// [`CounterReport`].
        CountersReply(CounterReport<'a>),
    }
}

/// Worker -> daemon: the worker's counters, and its notifications by error status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterReport<'a> {
    /// The totals.
    pub counters: WorkerCounters,
    /// Each error status that occurred, and how often.
    pub errors: List<'a, ErrorEntry>,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ErrorsHeadWire {
    count: U32,
    reserved: U32,
}
assert_eq_size!(ErrorsHeadWire, [u8; 8]);

impl<'a> Message<'a> for CounterReport<'a> {
    const FIXED_LEN: usize = COUNTERS_LEN + size_of::<ErrorsHeadWire>();

    fn parse(body: &'a [u8]) -> Result<Self, DecodeError> {
        let (counters, rest) = WorkerCounters::decode(body)?;
        let (head, rest) = prefix::<ErrorsHeadWire>(rest)?;
        reserved_zero("counter_report.reserved", head.reserved.get().into())?;
        let (errors, rest) = List::decode(rest, head.count.get() as usize)?;
        no_trailing(body, rest)?;
        Ok(Self { counters, errors })
    }

    fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.errors.encoded_len()
    }

    fn emit(&self, dst: &mut [u8]) -> Result<(), EncodeError> {
        let rest = self.counters.encode(dst);
        let head = ErrorsHeadWire {
            count: U32::new(count_u32("error entries", self.errors.len())?),
            reserved: U32::ZERO,
        };
        self.errors.encode(put(rest, &head))
    }
}
