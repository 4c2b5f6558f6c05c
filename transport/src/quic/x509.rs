//! The few things vfabric reads back from an X.509 certificate: its DNS subject alternative names, its subject
//! (DER, and its common name) and its public key (DER).
//!
//! rustls hands over a peer's certificates as DER, and rcgen only writes certificates, so they are read with
//! RustCrypto's `x509-cert`. Certificates read here have either been verified by rustls already (a peer's) or
//! are compared with one rcgen built (a CA loaded from disk); anything malformed gives `None`, never a panic.

use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::Certificate;

fn parse(cert: &[u8]) -> Option<Certificate> {
    Certificate::from_der(cert).ok()
}

/// The DNS names of the certificate's subject alternative names, in order (empty when it has none); `None`
/// when the certificate cannot be read.
pub(crate) fn dns_names(cert: &[u8]) -> Option<Vec<String>> {
    let cert = parse(cert)?;
    let Some((_, san)) = cert.tbs_certificate().get_extension::<SubjectAltName>().ok()? else {
        return Some(Vec::new());
    };
    Some(
        san.0
            .into_iter()
            .filter_map(|name| match name {
                GeneralName::DnsName(dns) => Some(dns.to_string()),
                _ => None,
            })
            .collect(),
    )
}

/// The certificate's subject, DER-encoded.
pub(crate) fn subject(cert: &[u8]) -> Option<Vec<u8>> {
    parse(cert)?.tbs_certificate().subject().to_der().ok()
}

/// The certificate's SubjectPublicKeyInfo, DER-encoded.
pub(crate) fn public_key_info(cert: &[u8]) -> Option<Vec<u8>> {
    parse(cert)?.tbs_certificate().subject_public_key_info().to_der().ok()
}

/// The first organizational unit of the certificate's subject.
pub(crate) fn organizational_unit(cert: &[u8]) -> Option<String> {
    parse(cert)?.tbs_certificate().subject().organization_unit().ok()?.map(String::from)
}

/// The first common name of the certificate's subject.
pub(crate) fn common_name(cert: &[u8]) -> Option<String> {
    parse(cert)?.tbs_certificate().subject().common_name().ok()?.map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str], cn: &str) -> rcgen::Certificate {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "org");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.self_signed(&key).unwrap()
    }

    #[test]
    fn reads_dns_names_in_order() {
        let c = cert(&["n0", "other.example", "127.0.0.1"], "x");
        assert_eq!(dns_names(c.der()).unwrap(), vec!["n0".to_string(), "other.example".to_string()]);
    }

    #[test]
    fn no_san_extension_gives_no_names() {
        let c = cert(&[], "x");
        assert_eq!(dns_names(c.der()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn reads_common_name_subject_and_key() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["n0".to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, "cluster a");
        let c = params.self_signed(&key).unwrap();
        assert_eq!(common_name(c.der()).unwrap(), "cluster a");
        assert_eq!(public_key_info(c.der()).unwrap(), key.public_key_der());
        let s = subject(c.der()).unwrap();
        // A SEQUENCE (the RDN sequence) holding the name's text.
        assert_eq!(s[0], 0x30);
        assert!(s.windows(9).any(|w| w == b"cluster a"));
    }

    #[test]
    fn malformed_input_gives_none() {
        let c = cert(&["n0"], "x");
        let der = c.der().to_vec();
        for cut in [0, 1, 2, 10, der.len() / 2, der.len() - 1] {
            assert!(dns_names(&der[..cut]).is_none(), "cut at {cut}");
            assert!(common_name(&der[..cut]).is_none(), "cut at {cut}");
        }
        assert!(dns_names(b"\x30\x80\x00\x00").is_none());
        assert!(dns_names(b"\x30\x85\x01\x00\x00\x00\x00").is_none());
        assert!(dns_names(b"\x1f\x01\x00").is_none());
        assert!(subject(&[]).is_none());
    }

    #[test]
    fn any_corruption_never_panics() {
        let c = cert(&["n0"], "x");
        let der = c.der().to_vec();
        for i in 0..der.len() {
            let mut bad = der.clone();
            bad[i] ^= 0xff;
            let _ = dns_names(&bad);
            let _ = common_name(&bad);
            let _ = public_key_info(&bad);
        }
    }
}
