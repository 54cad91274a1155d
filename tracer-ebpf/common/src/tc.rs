//! What only the tc programs share with userspace: the direction of a
//! hook, and the slots of their IPv6 twins.

/// Where on the tc hook a packet was seen.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress = 0,
    Egress = 1,
}

/// Slots of the `IPV6_PROGRAMS` tail-call table: each tc program's IPv6
/// twin.
pub mod ipv6_program {
    pub const INGRESS: u32 = 0;
    pub const EGRESS: u32 = 1;
    pub const TO_POD: u32 = 2;
    pub const INGRESS_L3: u32 = 3;
    pub const EGRESS_L3: u32 = 4;
    pub const COUNT: u32 = 5;
}
