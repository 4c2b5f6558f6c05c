//! Just enough DER to read three things from an X.509 certificate: its DNS subject alternative names, its
//! subject (raw, and its common name) and its public key (raw).
//!
//! rustls hands over a peer's certificates as DER and rcgen (without its `x509-parser` feature) cannot read
//! one back, so this walks the few fields needed. Certificates read here have either been verified by
//! rustls already (a peer's) or are compared byte for byte with one rcgen built (a CA loaded from disk);
//! anything malformed gives `None`, never a panic.

/// SEQUENCE.
const SEQUENCE: u8 = 0x30;
/// SET.
const SET: u8 = 0x31;
/// INTEGER.
const INTEGER: u8 = 0x02;
/// BOOLEAN.
const BOOLEAN: u8 = 0x01;
/// OCTET STRING.
const OCTET_STRING: u8 = 0x04;
/// OBJECT IDENTIFIER.
const OID: u8 = 0x06;
/// `[0] EXPLICIT` (the certificate's version).
const VERSION: u8 = 0xa0;
/// `[3] EXPLICIT` (the certificate's extensions).
const EXTENSIONS: u8 = 0xa3;
/// `dNSName [2] IMPLICIT IA5String` inside a GeneralName.
const DNS_NAME: u8 = 0x82;
/// id-ce-subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// The string types a common name may be written in that hold UTF-8 (or a subset of it).
const UTF8_STRING: u8 = 0x0c;
const PRINTABLE_STRING: u8 = 0x13;
const IA5_STRING: u8 = 0x16;

/// One DER element: its tag, its contents, and the whole element (tag and length included).
#[derive(Debug, Clone, Copy)]
struct Tlv<'a> {
    tag: u8,
    content: &'a [u8],
    raw: &'a [u8],
}

/// Reads the next element from `input` and advances past it.
fn next<'a>(input: &mut &'a [u8]) -> Option<Tlv<'a>> {
    let all: &'a [u8] = input;
    let (&tag, rest) = all.split_first()?;
    // High tag numbers (multi-byte tags) never occur in the fields read here.
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        // 0x80 is the indefinite form, which DER forbids; more than 4 length bytes is never a certificate.
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return None;
    }
    let header_len = all.len() - rest.len();
    let (content, after) = rest.split_at(len);
    *input = after;
    Some(Tlv { tag, content, raw: &all[..header_len + len] })
}

/// Reads the next element and checks its tag.
fn expect<'a>(input: &mut &'a [u8], tag: u8) -> Option<Tlv<'a>> {
    next(input).filter(|tlv| tlv.tag == tag)
}

/// The fields of a TBSCertificate read here.
struct Tbs<'a> {
    subject: Tlv<'a>,
    spki: Tlv<'a>,
    /// The contents of the `Extensions` SEQUENCE, if there is one.
    extensions: Option<&'a [u8]>,
}

fn tbs(cert: &[u8]) -> Option<Tbs<'_>> {
    let mut input = cert;
    let certificate = expect(&mut input, SEQUENCE)?;
    let mut certificate = certificate.content;
    let tbs = expect(&mut certificate, SEQUENCE)?;
    let mut fields = tbs.content;
    let mut serial = next(&mut fields)?;
    if serial.tag == VERSION {
        serial = next(&mut fields)?;
    }
    if serial.tag != INTEGER {
        return None;
    }
    let _signature = expect(&mut fields, SEQUENCE)?;
    let _issuer = expect(&mut fields, SEQUENCE)?;
    let _validity = expect(&mut fields, SEQUENCE)?;
    let subject = expect(&mut fields, SEQUENCE)?;
    let spki = expect(&mut fields, SEQUENCE)?;
    let mut extensions = None;
    while !fields.is_empty() {
        let field = next(&mut fields)?;
        if field.tag == EXTENSIONS {
            let mut inner = field.content;
            extensions = Some(expect(&mut inner, SEQUENCE)?.content);
        }
    }
    Some(Tbs { subject, spki, extensions })
}

/// The DNS names in the certificate's subject alternative name extension, in order; `None` if the
/// certificate cannot be read. A certificate without the extension gives an empty list.
pub(crate) fn dns_names(cert: &[u8]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let Some(mut extensions) = tbs(cert)?.extensions else {
        return Some(names);
    };
    while !extensions.is_empty() {
        let extension = expect(&mut extensions, SEQUENCE)?;
        let mut fields = extension.content;
        let id = expect(&mut fields, OID)?;
        if id.content != SUBJECT_ALT_NAME {
            continue;
        }
        let mut value = next(&mut fields)?;
        if value.tag == BOOLEAN {
            value = next(&mut fields)?;
        }
        if value.tag != OCTET_STRING {
            return None;
        }
        let mut general_names = value.content;
        let sequence = expect(&mut general_names, SEQUENCE)?;
        let mut general_names = sequence.content;
        while !general_names.is_empty() {
            let name = next(&mut general_names)?;
            if name.tag == DNS_NAME {
                names.push(String::from_utf8(name.content.to_vec()).ok()?);
            }
        }
    }
    Some(names)
}

/// The certificate's subject, the whole DER element.
pub(crate) fn subject(cert: &[u8]) -> Option<&[u8]> {
    Some(tbs(cert)?.subject.raw)
}

/// The certificate's SubjectPublicKeyInfo, the whole DER element.
pub(crate) fn public_key_info(cert: &[u8]) -> Option<&[u8]> {
    Some(tbs(cert)?.spki.raw)
}

/// The first common name in the certificate's subject.
pub(crate) fn common_name(cert: &[u8]) -> Option<String> {
    let mut rdns = tbs(cert)?.subject.content;
    while !rdns.is_empty() {
        let rdn = expect(&mut rdns, SET)?;
        let mut attributes = rdn.content;
        while !attributes.is_empty() {
            let attribute = expect(&mut attributes, SEQUENCE)?;
            let mut fields = attribute.content;
            let id = expect(&mut fields, OID)?;
            if id.content != COMMON_NAME {
                continue;
            }
            let value = next(&mut fields)?;
            return match value.tag {
                UTF8_STRING | PRINTABLE_STRING | IA5_STRING => String::from_utf8(value.content.to_vec()).ok(),
                _ => None,
            };
        }
    }
    None
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
        assert_eq!(public_key_info(c.der()).unwrap(), key.public_key_der().as_slice());
        let s = subject(c.der()).unwrap();
        assert_eq!(s[0], SEQUENCE);
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
