//! Keeps tool calls and webhook deliveries on the public internet. A
//! tool's URL comes from the agent's definition, but the model chooses its
//! arguments; a webhook's URL comes from a tenant; and either may be made
//! to point elsewhere (an open redirect, a DNS name an attacker controls).
//! Unless private networks are allowed, a call may connect only to a
//! public address: never to loopback,
//! private, link-local (the cloud metadata endpoint at 169.254.169.254 is
//! one), CGNAT, unspecified, multicast or reserved ones, written as IPv4 or
//! as any IPv6 form that carries an IPv4 address.
//!
//! The check is made on the addresses the connection is made to, after
//! resolution ([`PublicAddressResolver`]), so a name that resolves to a
//! private address is refused whatever it looked like. A URL whose host is
//! an IP address is never resolved, so [`check_url`] looks at it first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// A tool's destination is not on the public internet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the destination is not a public internet address")]
pub struct NotPublic;

/// IPv4 networks a tool call may not reach: (network, prefix length).
const NOT_PUBLIC_V4: [(Ipv4Addr, u8); 15] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network"; 0.0.0.0 reaches the host itself
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private (RFC 1918)
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // CGNAT (RFC 6598)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local, cloud metadata
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private (RFC 1918)
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // 6to4 relay anycast
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private (RFC 1918)
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, broadcast
];

/// IPv6 networks a tool call may not reach, besides those that carry an
/// IPv4 address (judged by that address).
const NOT_PUBLIC_V6: [(Ipv6Addr, u8); 9] = [
    (Ipv6Addr::UNSPECIFIED, 128),
    (Ipv6Addr::LOCALHOST, 128),
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48), // local-use NAT64 (RFC 8215): any IPv4 behind it
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32),    // Teredo: tunnels to any IPv4
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64),     // discard-only
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),     // unique local (AWS's IPv6 metadata is fd00:ec2::254)
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 9),     // link-local fe80::/10 and site-local fec0::/10 (deprecated)
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),     // multicast
];

fn in_v4(address: Ipv4Addr, (network, prefix): (Ipv4Addr, u8)) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    u32::from(address) & mask == u32::from(network) & mask
}

fn in_v6(address: Ipv6Addr, (network, prefix): (Ipv6Addr, u8)) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    u128::from(address) & mask == u128::from(network) & mask
}

/// The IPv4 address an IPv6 address stands for, where one does: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`, RFC 2765's
/// SIIT), IPv4-compatible (`::a.b.c.d`, deprecated), NAT64
/// (`64:ff9b::a.b.c.d`, which a NAT64 gateway translates) and 6to4
/// (`2002:aabb:ccdd::`).
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(address);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if in_v6(address, (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96))
        || in_v6(address, (Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, 0, 0), 96))
        || in_v6(address, (Ipv6Addr::UNSPECIFIED, 96))
        || in_v6(address, (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96))
    {
        return Some(low);
    }
    if in_v6(address, (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16)) {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    None
}

/// Whether a tool call may connect to `address`.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => !NOT_PUBLIC_V4.iter().any(|&network| in_v4(v4, network)),
        IpAddr::V6(v6) => {
            // `::` and `::1` are in the IPv4-compatible range too; they are
            // refused by the table either way.
            if NOT_PUBLIC_V6.iter().any(|&network| in_v6(v6, network)) {
                return false;
            }
            embedded_v4(v6).is_none_or(|v4| is_public(IpAddr::V4(v4)))
        }
    }
}

/// Refuses a URL whose host is an IP address that is not public, or a name
/// that always means this machine (`localhost` and its subdomains), and one
/// that does not parse. Other names are judged by what they resolve to, in
/// [`PublicAddressResolver`].
pub fn check_url(url: &str) -> Result<(), NotPublic> {
    let url = reqwest::Url::parse(url).map_err(|_| NotPublic)?;
    let host = url.host_str().ok_or(NotPublic)?;
    // The URL parser has already written every IPv4 form (`127.1`,
    // `0x7f.0.0.1`, `2130706433`) as dotted decimal; IPv6 is in brackets.
    let bare = host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host);
    if let Ok(address) = bare.parse::<IpAddr>() {
        return if is_public(address) { Ok(()) } else { Err(NotPublic) };
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") { Err(NotPublic) } else { Ok(()) }
}

/// The addresses of `resolved` a tool call may connect to; none is an error.
pub fn only_public(resolved: impl IntoIterator<Item = SocketAddr>) -> Result<Vec<SocketAddr>, NotPublic> {
    let public: Vec<SocketAddr> = resolved.into_iter().filter(|address| is_public(address.ip())).collect();
    if public.is_empty() { Err(NotPublic) } else { Ok(public) }
}

/// Resolves names with the system's resolver and keeps only the public
/// addresses; a name with none fails with [`NotPublic`], before any
/// connection is attempted.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicAddressResolver;

impl Resolve for PublicAddressResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port (or the scheme's) in.
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let addresses: Addrs = Box::new(only_public(resolved)?.into_iter());
            Ok(addresses)
        })
    }
}

/// Whether `url`'s host resolves, and only to addresses that are not
/// public: why the resolver refused a connection to it, in words, where
/// the client's error does not carry the reason (the MCP client's). A name
/// that does not resolve is `false`.
pub async fn resolves_only_to_private(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else { return false };
    let Some(host) = url.host_str() else { return false };
    let bare = host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host);
    match tokio::net::lookup_host((bare, url.port_or_known_default().unwrap_or(0))).await {
        Ok(resolved) => {
            let resolved: Vec<SocketAddr> = resolved.collect();
            !resolved.is_empty() && only_public(resolved).is_err()
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_that_resolves_only_to_this_machine_is_told_apart() {
        assert!(resolves_only_to_private("http://localhost:9/mcp").await);
        assert!(resolves_only_to_private("http://127.0.0.1:9/mcp").await);
        assert!(!resolves_only_to_private("http://no-such-name.invalid/mcp").await);
        assert!(!resolves_only_to_private("http://8.8.8.8/mcp").await);
    }

    fn public(text: &str) -> bool {
        is_public(text.parse().unwrap())
    }

    #[test]
    fn private_local_and_reserved_addresses_are_not_public() {
        for address in [
            "127.0.0.1",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.0.1",
            "100.64.0.1",
            "100.127.255.255",
            "100.100.100.200",
            "192.0.0.192",
            "198.18.0.1",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd00:ec2::254",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "100::1",
            // IPv4 addresses written as IPv6.
            "::ffff:127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::ffff:0.0.0.0",
            "::ffff:0:7f00:1",
            "::ffff:0:127.0.0.1",
            "::ffff:0:10.0.0.1",
            "::ffff:0:169.254.169.254",
            "::127.0.0.1",
            "::10.1.2.3",
            "64:ff9b::10.0.0.1",
            "64:ff9b::169.254.169.254",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "64:ff9b:1::a00:1",
            "2001:0:4136:e378::1",
        ] {
            assert!(!public(address), "{address} was taken as public");
        }
    }

    #[test]
    fn internet_addresses_are_public() {
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "9.255.255.255",
            "11.0.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.255.255",
            "172.15.255.255",
            "172.32.0.1",
            "192.167.255.255",
            "192.169.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "::ffff:0:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            assert!(public(address), "{address} was refused");
        }
    }

    #[test]
    fn urls_with_a_local_literal_or_localhost_are_refused_before_any_call() {
        for url in [
            "http://127.0.0.1:8080/x",
            "http://127.1/x",
            "http://0x7f.0.0.1/x",
            "http://2130706433/x",
            "http://[::1]/x",
            "http://[::ffff:127.0.0.1]:9001/x",
            "https://[::ffff:0:7f00:1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fd00:ec2::254]/latest",
            "http://localhost:9001/2018-06-01/runtime/invocation/next",
            "http://LOCALHOST./x",
            "https://api.localhost/x",
            "not a url",
        ] {
            assert_eq!(check_url(url), Err(NotPublic), "{url}");
        }
        for url in ["https://api.example.com/x", "http://8.8.8.8/x", "https://[2606:4700:4700::1111]/x"] {
            assert_eq!(check_url(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn only_public_keeps_the_public_addresses_and_fails_without_any() {
        let addresses: Vec<SocketAddr> =
            ["127.0.0.1:80", "8.8.8.8:80", "[::1]:80", "[2606:4700:4700::1111]:80", "[::ffff:10.0.0.1]:80"]
                .iter()
                .map(|text| text.parse().unwrap())
                .collect();
        let kept = only_public(addresses.clone()).unwrap();
        assert_eq!(kept, vec![addresses[1], addresses[3]]);
        assert_eq!(only_public([addresses[0], addresses[2], addresses[4]]), Err(NotPublic));
        assert_eq!(only_public([]), Err(NotPublic));
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_that_resolves_only_to_this_machine() {
        let name: Name = "localhost".parse().unwrap();
        let error = match PublicAddressResolver.resolve(name).await {
            Ok(addresses) => panic!("localhost resolved to {:?}", addresses.collect::<Vec<_>>()),
            Err(error) => error,
        };
        assert!(error.downcast_ref::<NotPublic>().is_some(), "{error}");
    }
}
