//! `ibv_wc_status_str(3)`, `ibv_event_type_str(3)`, `ibv_port_state_str(3)`: the same texts
//! libibverbs returns (static, NUL-terminated).

use core::ffi::c_char;

use hotverbs_ffi::{ibv_event_type, ibv_port_state, ibv_wc_status};

const WC: [&[u8]; 24] = [
    b"success\0",
    b"local length error\0",
    b"local QP operation error\0",
    b"local EE context operation error\0",
    b"local protection error\0",
    b"Work Request Flushed Error\0",
    b"memory management operation error\0",
    b"bad response error\0",
    b"local access error\0",
    b"remote invalid request error\0",
    b"remote access error\0",
    b"remote operation error\0",
    b"transport retry counter exceeded\0",
    b"RNR retry counter exceeded\0",
    b"local RDD violation error\0",
    b"remote invalid RD request\0",
    b"aborted error\0",
    b"invalid EE context number\0",
    b"invalid EE context state\0",
    b"fatal error\0",
    b"response timeout error\0",
    b"general error\0",
    b"TM error\0",
    b"TM software rendezvous\0",
];

const EV: [&[u8]; 20] = [
    b"CQ error\0",
    b"local work queue catastrophic error\0",
    b"invalid request local work queue error\0",
    b"local access violation work queue error\0",
    b"communication established\0",
    b"send queue drained\0",
    b"path migrated\0",
    b"path migration request error\0",
    b"local catastrophic error\0",
    b"port active\0",
    b"port error\0",
    b"LID change\0",
    b"P_Key change\0",
    b"SM change\0",
    b"SRQ catastrophic error\0",
    b"SRQ limit reached\0",
    b"last WQE reached\0",
    b"client reregistration\0",
    b"GID table change\0",
    b"WQ fatal\0",
];

const PORT: [&[u8]; 6] = [
    b"PORT_NOP\0",
    b"PORT_DOWN\0",
    b"PORT_INIT\0",
    b"PORT_ARMED\0",
    b"PORT_ACTIVE\0",
    b"PORT_ACTIVE_DEFER\0",
];

fn pick(table: &[&'static [u8]], i: u32, other: &'static [u8]) -> *const c_char {
    table
        .get(i as usize)
        .copied()
        .unwrap_or(other)
        .as_ptr()
        .cast()
}

pub(crate) unsafe extern "C" fn wc_status_str(s: ibv_wc_status) -> *const c_char {
    pick(&WC, s, b"unknown\0")
}

pub(crate) unsafe extern "C" fn event_type_str(e: ibv_event_type) -> *const c_char {
    pick(&EV, e, b"unknown\0")
}

pub(crate) unsafe extern "C" fn port_state_str(p: ibv_port_state) -> *const c_char {
    pick(&PORT, p, b"invalid state\0")
}

pub(crate) unsafe extern "C" fn node_type_str(n: hotverbs_ffi::ibv_node_type) -> *const c_char {
    const NODE: [&[u8]; 7] = [
        b"unknown\0",
        b"InfiniBand channel adapter\0",
        b"InfiniBand switch\0",
        b"InfiniBand router\0",
        b"iWARP NIC\0",
        b"usNIC\0",
        b"usNIC UDP\0",
    ];
    pick(&NODE, u32::try_from(n).unwrap_or(u32::MAX), b"unknown\0")
}
