//! Valid frames of every kind a host sends, and the ways to break them: random bytes, flipped
//! bits, overwritten bytes and header fields set to edge values, cut short or run long.

use urom_graph::GraphCommand;
use urom_wire::control::{
    AUTH_DATA_LEN, AuthMethod, AuthResponse, ControlMessage, Hello, SpawnWorker, WORKER_ID_ANY,
};
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, write_command_headers};
use urom_wire::{FRAME_HEADER_LEN, FrameRepr, List, MaxMsgSize, PROTOCOL_VERSION};

use crate::Rng;

/// `body` as a frame with sequence number `seq`.
pub fn control_frame(seq: u64, body: ControlMessage<'_>, max: MaxMsgSize) -> Vec<u8> {
    let frame = FrameRepr { seq, body };
    let mut bytes = vec![0u8; frame.buffer_len()];
    let len = frame.emit(&mut bytes, max).expect("an encodable frame");
    bytes.truncate(len);
    bytes
}

/// The hello a host opens with.
pub fn hello(seq: u64, max: MaxMsgSize) -> Vec<u8> {
    control_frame(
        seq,
        ControlMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            max_msg_size: max.as_u32(),
            identity: "urom-chaos-host",
        }),
        max,
    )
}

/// The peer-credential authentication that follows the hello.
pub fn auth_response(seq: u64, max: MaxMsgSize) -> Vec<u8> {
    control_frame(
        seq,
        ControlMessage::AuthResponse(AuthResponse {
            method: AuthMethod::PeerCredentials,
            proof: [0; AUTH_DATA_LEN],
        }),
        max,
    )
}

/// One valid frame of each kind a host sends (no destroy: a broken one could name a worker
/// another host uses).
pub fn control_seeds(max: MaxMsgSize) -> Vec<Vec<u8>> {
    let env = ["UROM_CHAOS=1"];
    vec![
        hello(1, max),
        auth_response(2, max),
        control_frame(3, ControlMessage::PluginListRequest, max),
        control_frame(4, ControlMessage::CpusetRequest, max),
        control_frame(5, ControlMessage::WorkersByGidRequest { gid: 7 }, max),
        control_frame(
            6,
            ControlMessage::SpawnWorker(SpawnWorker {
                worker_id: WORKER_ID_ANY,
                plugins: 1,
                gid: 9,
                max_inflight_tasks: 64,
                cpuset: "0".parse().expect("a CPU list"),
                env: List::new(&env),
            }),
            max,
        ),
    ]
}

/// A graph loopback command for plugin `graph`.
pub fn loopback_command(seq: u64, graph: u64, context: u64, max: MaxMsgSize) -> Vec<u8> {
    let mut frame = vec![0u8; COMMAND_PAYLOAD_OFFSET + 16];
    let len = write_command_headers(&mut frame, seq, graph, context, 16, max)
        .expect("a loopback fits every message size");
    GraphCommand::Loopback { data: context }
        .pack(&mut frame[COMMAND_PAYLOAD_OFFSET..])
        .expect("16 bytes hold a loopback");
    frame.truncate(len);
    frame
}

/// Random bytes, up to `max_len` long (sometimes none at all).
pub fn random_frame(rng: &mut Rng, max_len: usize) -> Vec<u8> {
    let len = if rng.percent(3) {
        0
    } else {
        rng.between(1, max_len as u64) as usize
    };
    rng.bytes(len)
}

/// Lengths a header may claim that sit on the edges: nothing, less than a header, exactly a
/// header, one off the frame's own length, the maximum, one past it, and absurd.
fn edge_lengths(frame_len: usize, max: MaxMsgSize) -> [u32; 9] {
    let frame_len = frame_len as u32;
    [
        0,
        FRAME_HEADER_LEN as u32 - 1,
        FRAME_HEADER_LEN as u32,
        frame_len.saturating_sub(1),
        frame_len + 1,
        max.as_u32(),
        max.as_u32() + 1,
        1 << 31,
        u32::MAX,
    ]
}

/// `seed` broken one to three ways: bits flipped, bytes overwritten or zeroed, the header's
/// length, kind, version or flags set to edge or random values, cut short, run long, or
/// spliced with random bytes.
pub fn mutate(rng: &mut Rng, seed: &[u8], max: MaxMsgSize) -> Vec<u8> {
    let mut frame = seed.to_vec();
    for _ in 0..rng.between(1, 3) {
        match rng.below(10) {
            0 if !frame.is_empty() => {
                for _ in 0..rng.between(1, 8) {
                    let at = rng.index(frame.len());
                    frame[at] ^= 1 << rng.below(8);
                }
            }
            1 if !frame.is_empty() => {
                for _ in 0..rng.between(1, 4) {
                    let at = rng.index(frame.len());
                    frame[at] = rng.next_u64() as u8;
                }
            }
            2 if !frame.is_empty() => {
                let cut = rng.index(frame.len());
                frame.truncate(cut);
            }
            3 => {
                let more = rng.between(1, 64) as usize;
                frame.extend(rng.bytes(more));
            }
            4 if frame.len() >= 12 => {
                let length = *rng.pick(&edge_lengths(frame.len(), max));
                frame[8..12].copy_from_slice(&length.to_le_bytes());
            }
            5 if frame.len() >= 8 => {
                let kinds = [0x0101u16, 0x0104, 0x0110, 0x0201, 0x0203, 0, 0xffff];
                let kind = if rng.percent(50) {
                    *rng.pick(&kinds)
                } else {
                    rng.next_u64() as u16
                };
                frame[6..8].copy_from_slice(&kind.to_le_bytes());
            }
            6 if frame.len() >= 6 => {
                let version = rng.between(0, 3) as u16;
                frame[4..6].copy_from_slice(&version.to_le_bytes());
            }
            7 if frame.len() >= 16 => {
                let flags = 1u32 << rng.below(32);
                frame[12..16].copy_from_slice(&flags.to_le_bytes());
            }
            8 if frame.len() > FRAME_HEADER_LEN => {
                // The header stays, the body is random.
                let body = frame.len() - FRAME_HEADER_LEN;
                let random = rng.bytes(body);
                frame[FRAME_HEADER_LEN..].copy_from_slice(&random);
            }
            _ if !frame.is_empty() => {
                let start = rng.index(frame.len());
                let end = start + rng.index(frame.len() - start) + 1;
                frame[start..end].fill(0);
            }
            _ => {
                let len = rng.between(1, 64) as usize;
                frame = rng.bytes(len);
            }
        }
    }
    frame.truncate(max.get());
    frame
}
