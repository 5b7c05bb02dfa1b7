//! What both sides agree on ([`ChannelParams`]), exchanged in the hellos, and the settings
//! of the data connections that follow from it.

use std::time::Duration;

use urom_transport::ChannelConfig;
use urom_transport::WaitMode;
use urom_transport::shm::{HugePages, MAX_MAPPING_LEN};
use urom_wire::DecodeError;
use urom_wire::MaxMsgSize;
use urom_wire::gpu::CLIENT_HEADER_LEN;
use urom_wire::gpu::channel::{
    CHANNEL_HELLO_LEN, CHANNEL_HELLO_MAGIC, CHANNEL_VERSION, ChannelHelloRepr,
};

use super::error::ChannelError;
use crate::limits::{self, BATCH_BYTES};

/// How long one step of the setup may take once the peer is there.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// The thread count of a server's hello that says it already has an orchestrator: a server
/// has at least one thread, so no real hello says 0 (an orchestrator of an older build reads
/// it as a thread-count mismatch naming 0).
pub(super) const BUSY_THREADS: u32 = 0;

/// How often a wait checks the stop flag.
pub const TICK: Duration = Duration::from_millis(50);

/// What both sides must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelParams {
    /// Server data-path threads (`--cpu` count) = orchestrator processor threads (`-t`).
    pub threads: u32,
    /// Largest payload, headers excluded (`--max-message-length`).
    pub max_message_length: u32,
    /// Requests in flight per thread (`--max-concurrent-messages`); the server's value is the
    /// one used.
    pub max_concurrent: u32,
}

impl ChannelParams {
    /// The largest client message: header and the largest payload.
    pub fn max_message(&self) -> usize {
        CLIENT_HEADER_LEN + self.max_message_length as usize
    }

    /// The largest frame on a data connection: [`BATCH_BYTES`], or one largest message when
    /// that is more.
    pub fn frame_capacity(&self) -> usize {
        self.max_message().max(BATCH_BYTES)
    }

    /// The shared-memory settings of every data connection.
    pub fn channel_config(&self) -> Result<ChannelConfig, ChannelError> {
        let frame = u32::try_from(self.frame_capacity())
            .ok()
            .map(|frame| frame.max(MaxMsgSize::MIN));
        let max_msg_size = frame
            .and_then(|frame| MaxMsgSize::new(frame).ok())
            .filter(|frame| {
                limits::mapping_len(frame.as_u32(), self.max_concurrent) <= MAX_MAPPING_LEN
            })
            .ok_or(ChannelError::MessageTooLong {
                len: self.max_message_length,
            })?;
        Ok(ChannelConfig {
            max_msg_size,
            slots: limits::channel_slots(self.max_concurrent),
            wait: WaitMode::Adaptive {
                spin: Duration::from_micros(20),
            },
            hugepages: HugePages::Auto,
            handshake_timeout: STEP_TIMEOUT,
        })
    }

    /// The hello a server that already has an orchestrator answers another one with: its own,
    /// with no threads ([`BUSY_THREADS`]).
    pub(super) fn busy_hello(&self) -> [u8; CHANNEL_HELLO_LEN] {
        ChannelParams {
            threads: BUSY_THREADS,
            ..*self
        }
        .hello()
    }

    pub(super) fn hello(&self) -> [u8; CHANNEL_HELLO_LEN] {
        ChannelHelloRepr {
            threads: self.threads,
            max_message_length: self.max_message_length,
            max_concurrent: self.max_concurrent,
        }
        .to_bytes()
    }

    /// The peer's parameters from its hello. A hello of another version is
    /// [`ChannelError::Version`] whatever its length, so that a later version may grow it.
    pub(super) fn from_hello(hello: &[u8]) -> Result<Self, ChannelError> {
        match ChannelHelloRepr::parse(hello) {
            Ok(hello) => Ok(Self {
                threads: hello.threads,
                max_message_length: hello.max_message_length,
                max_concurrent: hello.max_concurrent,
            }),
            Err(DecodeError::UnsupportedFormatVersion { found, .. }) => {
                Err(ChannelError::Version(found))
            }
            Err(_) => {
                // A hello's magic, then its version word.
                let version = hello
                    .strip_prefix(&CHANNEL_HELLO_MAGIC)
                    .and_then(|rest| rest.get(..4))
                    .and_then(|word| <[u8; 4]>::try_from(word).ok())
                    .map(u32::from_be_bytes);
                match version {
                    Some(found) if found != CHANNEL_VERSION => Err(ChannelError::Version(found)),
                    _ => Err(ChannelError::NotAPeer),
                }
            }
        }
    }
}

/// Checks the peer's parameters against ours: the same on both sides.
pub(super) fn agree(
    server: &ChannelParams,
    orchestrator: &ChannelParams,
) -> Result<(), ChannelError> {
    if server.threads != orchestrator.threads {
        return Err(ChannelError::ThreadCountMismatch {
            server: server.threads,
            orchestrator: orchestrator.threads,
        });
    }
    if server.max_message_length != orchestrator.max_message_length {
        return Err(ChannelError::MessageLengthMismatch {
            server: server.max_message_length,
            orchestrator: orchestrator.max_message_length,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_of_another_version_is_named_whatever_its_length() {
        let mut newer = ChannelParams {
            threads: 1,
            max_message_length: 64,
            max_concurrent: 8,
        }
        .hello()
        .to_vec();
        newer[11] = 2;
        assert!(matches!(
            ChannelParams::from_hello(&newer),
            Err(ChannelError::Version(2))
        ));
        newer.extend_from_slice(&[0; 8]);
        assert!(matches!(
            ChannelParams::from_hello(&newer),
            Err(ChannelError::Version(2))
        ));
        let e = ChannelError::Version(2).to_string();
        assert!(
            e.contains("version 2") && e.contains("use matching builds"),
            "{e}"
        );
        assert!(matches!(
            ChannelParams::from_hello(b"GPUOFF"),
            Err(ChannelError::NotAPeer)
        ));
    }

    #[test]
    fn hellos_round_trip_and_mismatches_name_both_counts() {
        let server = ChannelParams {
            threads: 2,
            max_message_length: 256,
            max_concurrent: 128,
        };
        assert_eq!(ChannelParams::from_hello(&server.hello()).unwrap(), server);
        let orchestrator = ChannelParams {
            threads: 3,
            ..server
        };
        let e = agree(&server, &orchestrator).unwrap_err().to_string();
        assert!(e.contains("server has 2") && e.contains("-t 3"), "{e}");
        let mut bad = server.hello();
        bad[0] = b'X';
        assert!(matches!(
            ChannelParams::from_hello(&bad),
            Err(ChannelError::NotAPeer)
        ));
    }

    #[test]
    fn data_connections_have_room_for_every_request_in_flight() {
        let params = ChannelParams {
            threads: 1,
            max_message_length: 0,
            max_concurrent: 100,
        };
        let config = params.channel_config().unwrap();
        assert_eq!(config.slots, 32);
        assert_eq!(config.max_msg_size.as_u32() as usize, BATCH_BYTES);
        let long = ChannelParams {
            max_message_length: 100_000,
            max_concurrent: 1,
            ..params
        };
        let config = long.channel_config().unwrap();
        assert_eq!(config.slots, 2);
        assert_eq!(config.max_msg_size.as_u32(), 100_012);
        let huge = ChannelParams {
            max_message_length: u32::MAX,
            ..params
        };
        assert!(matches!(
            huge.channel_config(),
            Err(ChannelError::MessageTooLong { .. })
        ));
    }
}
