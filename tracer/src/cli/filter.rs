//! `--proto` and `--port`: which of the traced pair's packets are told,
//! chosen in the kernel so that the rest cost about what untraced
//! traffic does.

use anyhow::{bail, Result};
use podtrace_common::filter::{protocol_bit, L4Filter, MAX_ASKED_PORTS, MAX_FILTER_PORTS};

use crate::model::Translation;

#[derive(Clone, Debug, Default, clap::Args)]
pub struct FilterArgs {
    /// Tell only this protocol's packets (repeatable). An ICMP error
    /// (unreachable, time exceeded) counts as the packet it quotes.
    #[arg(long = "proto", value_enum, value_name = "tcp|udp|icmp")]
    pub protos: Vec<Proto>,
    /// Tell only packets with this port on either side (repeatable, up to
    /// 8). A Service's port also keeps its backends' target port. Packets
    /// without ports (pings) are left out unless --proto names them.
    #[arg(long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub ports: Vec<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
    Icmp,
}

impl Proto {
    fn bit(self) -> u32 {
        match self {
            Proto::Tcp => protocol_bit::TCP,
            Proto::Udp => protocol_bit::UDP,
            Proto::Icmp => protocol_bit::ICMP,
        }
    }
}

impl FilterArgs {
    /// Whether any filter was asked for.
    fn is_set(&self) -> bool {
        !self.protos.is_empty() || !self.ports.is_empty()
    }

    /// The filter as the kernel reads it (none asked for: `None`), with
    /// each Service port of `translations` that it keeps widened to the
    /// backends' port (the packet after the DNAT carries only that one).
    pub fn kernel_filter(&self, translations: &[Translation]) -> Result<Option<L4Filter>> {
        if !self.is_set() {
            return Ok(None);
        }
        let mut filter = L4Filter {
            protocols: self.protos.iter().fold(0, |bits, p| bits | p.bit()),
            ..L4Filter::default()
        };
        let mut asked = self.ports.clone();
        asked.sort_unstable();
        asked.dedup();
        if asked.len() > MAX_ASKED_PORTS {
            bail!(
                "--port: at most {MAX_ASKED_PORTS} ports ({} given)",
                asked.len()
            );
        }
        for &port in &asked {
            add_port(&mut filter, port)?;
        }
        for t in translations.iter().filter(|t| !t.source) {
            widen(&mut filter, t.protocol, t.front.port, t.back.port)?;
        }
        Ok(Some(filter))
    }

    /// These flags, as a command line that parses back into them (an
    /// agent's).
    pub fn argv(&self) -> Vec<String> {
        let protos = self.protos.iter().map(|p| {
            let value = clap::ValueEnum::to_possible_value(p).expect("no protocol is skipped");
            ["--proto".to_string(), value.get_name().to_string()]
        });
        let ports = self.ports.iter().map(|p| ["--port".into(), p.to_string()]);
        protos.chain(ports).flatten().collect()
    }
}

/// Keeps `back` too when `filter` keeps a packet of `protocol` to
/// `front`: one connection, before and after its translation (a Service
/// learnt from conntrack under way too).
pub fn widen(filter: &mut L4Filter, protocol: u8, front: u16, back: u16) -> Result<bool> {
    let ports = &filter.ports[..filter.ports_len as usize];
    if filter.ports_len == 0 || ports.contains(&back) || !ports.contains(&front) {
        return Ok(false);
    }
    if !filter.keeps(protocol, Some((0, front))) {
        return Ok(false);
    }
    add_port(filter, back)?;
    Ok(true)
}

fn add_port(filter: &mut L4Filter, port: u16) -> Result<()> {
    let len = filter.ports_len as usize;
    if filter.ports[..len].contains(&port) {
        return Ok(());
    }
    if len == MAX_FILTER_PORTS {
        bail!("--port: the kernel's filter holds {MAX_FILTER_PORTS} ports, the Services' target ports they keep included (port {port} is one too many)");
    }
    filter.ports[len] = port;
    filter.ports_len += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::model::Frontend;

    fn service(front: u16, back: u16) -> Translation {
        let at = |port| Frontend {
            ip: Ipv4Addr::new(10, 96, 0, 1).into(),
            port,
        };
        Translation {
            protocol: 6,
            front: at(front),
            back: at(back),
            service: Some("default/db".into()),
            backend: None,
            source: false,
        }
    }

    #[test]
    fn a_service_port_asked_for_keeps_its_target_port() {
        let args = FilterArgs {
            protos: vec![],
            ports: vec![80],
        };
        let filter = args
            .kernel_filter(&[service(80, 8080), service(443, 8443)])
            .unwrap()
            .unwrap();
        assert_eq!(&filter.ports[..filter.ports_len as usize], &[80, 8080]);
    }

    #[test]
    fn a_service_of_another_protocol_does_not_widen_the_filter() {
        let args = FilterArgs {
            protos: vec![Proto::Udp],
            ports: vec![80],
        };
        let filter = args.kernel_filter(&[service(80, 8080)]).unwrap().unwrap();
        assert_eq!(filter.ports_len, 1);
        assert_eq!(filter.protocols, protocol_bit::UDP);
    }

    #[test]
    fn more_ports_than_the_kernel_holds_is_one_line() {
        let args = FilterArgs {
            protos: vec![],
            ports: (1..=9).collect(),
        };
        let e = args.kernel_filter(&[]).unwrap_err().to_string();
        assert!(e.contains("at most 8 ports"), "{e}");
    }

    #[test]
    fn the_flags_parse_back() {
        let args = FilterArgs {
            protos: vec![Proto::Tcp, Proto::Icmp],
            ports: vec![8080, 53],
        };
        assert_eq!(
            args.argv().join(" "),
            "--proto tcp --proto icmp --port 8080 --port 53"
        );
    }
}
