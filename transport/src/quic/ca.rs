//! The cluster's certificate authority and the nodes' identities.
//!
//! `vfabric cluster init` makes a [`ClusterCa`] and issues every node a [`NodeIdentity`]: an ECDSA P-256 key and
//! a certificate whose DNS subject alternative name is the node's name, valid for both TLS server and client
//! authentication, so each node both accepts and dials its peers with the same identity.
//!
//! On disk (all PEM):
//!
//! | file | written by | mode |
//! |---|---|---|
//! | `ca.pem` | [`ClusterCa::save`], [`NodeIdentity::save`] | default |
//! | `ca-key.pem` | [`ClusterCa::save`] | 0600 |
//! | `<name>.pem` | [`NodeIdentity::save`] | default |
//! | `<name>-key.pem` | [`NodeIdentity::save`] | 0600 |
//!
//! Certificates are valid from 1975 to 4096 (rcgen's defaults): a cluster rotates its CA by making a new one,
//! not by expiry.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::error::QuicError;
use super::x509;

/// The CA certificate's file name inside a directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA key's file name inside a directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The organisation name written into every certificate's subject.
const ORGANIZATION: &str = "vfabric";
/// The longest cluster name: an X.509 common name holds at most 64 characters.
const MAX_CLUSTER_NAME: usize = 64;

/// The organizational unit of a node certificate's subject that binds the node to a tenant, before its id.
pub(crate) const TENANT_UNIT: &str = "tenant=";

/// The cluster's certificate authority: `vfabric cluster init` makes one and issues every node a certificate.
///
/// The CA certificate's subject is `O=vfabric, CN=<cluster>`; it may sign node certificates only (path length
/// 0). Its key never needs to leave the machine that issues certificates.
pub struct ClusterCa {
    cluster: String,
    /// The certificate as first made and saved: what nodes trust.
    cert_pem: String,
    /// The certificate rcgen signs with (issuer name and key identifier); when loaded from PEM it is rebuilt from
    /// the same parameters and key, so its subject and public key are those of `cert_pem`.
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa").field("cluster", &self.cluster).finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA, with a fresh key, for the cluster named `cluster` (1 to 64 characters, no control characters).
    pub fn generate(cluster: &str) -> Result<ClusterCa, QuicError> {
        validate_cluster_name(cluster)?;
        let key = KeyPair::generate().map_err(certificate_error("generating the CA key"))?;
        let cert = ca_params(cluster).self_signed(&key).map_err(certificate_error("signing the CA certificate"))?;
        Ok(ClusterCa { cluster: cluster.to_string(), cert_pem: cert.pem(), cert, key })
    }

    /// The CA from its certificate and key in PEM, as [`cert_pem`](Self::cert_pem) and
    /// [`key_pem`](Self::key_pem) wrote them.
    ///
    /// Only CAs made by [`generate`](Self::generate) load: the certificate must have the subject `generate`
    /// writes, and the key must be the certificate's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, QuicError> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| QuicError::Certificate(format!("reading the CA certificate: {e}")))?;
        let key = KeyPair::from_pem(key_pem).map_err(certificate_error("reading the CA key"))?;
        let cluster = x509::common_name(&der)
            .ok_or_else(|| QuicError::Certificate("the CA certificate has no readable common name".into()))?;
        validate_cluster_name(&cluster)?;
        let cert = ca_params(&cluster).self_signed(&key).map_err(certificate_error("rebuilding the CA certificate"))?;
        if x509::subject(&der) != x509::subject(cert.der()) {
            return Err(QuicError::Certificate(format!(
                "the certificate for cluster {cluster:?} is not a vfabric cluster CA (its subject differs)"
            )));
        }
        if x509::public_key_info(&der) != x509::public_key_info(cert.der()) {
            return Err(QuicError::Certificate(format!(
                "the key does not belong to the CA certificate of cluster {cluster:?}"
            )));
        }
        Ok(ClusterCa { cluster, cert_pem: cert_pem.to_string(), cert, key })
    }

    /// The cluster's name, as given to [`generate`](Self::generate).
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The CA certificate in PEM: what every node trusts.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA's private key in PEM (PKCS#8). Keep it secret: whoever has it can join the cluster.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for node `name` (its DNS SAN is `name`; names must be valid DNS labels such as "n0" or
    /// "h200x2-0"), signed by this CA, valid for both client and server auth.
    ///
    /// Every call makes a fresh key. See [`validate_node_name`] for the names allowed.
    pub fn issue(&self, name: &str) -> Result<NodeIdentity, QuicError> {
        self.issue_for(name, None)
    }

    /// As [`issue`](Self::issue), for a node that belongs to `tenant` when that is `Some`: its certificate
    /// says so (an organizational unit `tenant=<id>` in its subject, [`certificate_tenant`](super::certificate_tenant)),
    /// and its peers hold its calls to that tenant.
    pub fn issue_for(&self, name: &str, tenant: Option<u32>) -> Result<NodeIdentity, QuicError> {
        validate_node_name(name)?;
        let key = KeyPair::generate().map_err(certificate_error("generating a node key"))?;
        let mut params = CertificateParams::new(vec![name.to_string()])
            .map_err(|e| QuicError::Certificate(format!("node name {name:?}: {e}")))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, ORGANIZATION);
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some(t) = tenant {
            params.distinguished_name.push(DnType::OrganizationalUnitName, format!("{TENANT_UNIT}{t}"));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let cert =
            params.signed_by(&key, &self.cert, &self.key).map_err(certificate_error("signing the node certificate"))?;
        Ok(NodeIdentity {
            name: name.to_string(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }

    /// Writes `ca.pem` (cert only; the CA key goes to `ca-key.pem` with mode 0600) into `dir`.
    ///
    /// Creates `dir` if needed and replaces files already there.
    pub fn save(&self, dir: &Path) -> Result<(), QuicError> {
        fs::create_dir_all(dir)?;
        write_file(&dir.join(CA_CERT_FILE), &self.cert_pem, false)?;
        write_file(&dir.join(CA_KEY_FILE), &self.key_pem(), true)
    }

    /// Reads the CA that [`save`](Self::save) wrote into `dir`.
    pub fn load(dir: &Path) -> Result<ClusterCa, QuicError> {
        let cert_pem = read_file(&dir.join(CA_CERT_FILE))?;
        let key_pem = read_file(&dir.join(CA_KEY_FILE))?;
        ClusterCa::from_pem(&cert_pem, &key_pem)
    }
}

/// A node's certificate and key, and the CA certificate it trusts.
#[derive(Clone)]
pub struct NodeIdentity {
    /// The node's name: its certificate's DNS subject alternative name.
    pub name: String,
    /// The node's certificate in PEM.
    pub cert_pem: String,
    /// The node's private key in PEM (PKCS#8).
    pub key_pem: String,
    /// The cluster CA's certificate in PEM: peers must present a certificate it signed.
    pub ca_pem: String,
}

impl fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs.
        f.debug_struct("NodeIdentity").field("name", &self.name).finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// Writes `<name>.pem` and `<name>-key.pem` (0600) and `ca.pem` into `dir`.
    ///
    /// Creates `dir` if needed and replaces files already there.
    pub fn save(&self, dir: &Path) -> Result<(), QuicError> {
        validate_node_name(&self.name)?;
        fs::create_dir_all(dir)?;
        write_file(&dir.join(cert_file(&self.name)), &self.cert_pem, false)?;
        write_file(&dir.join(key_file(&self.name)), &self.key_pem, true)?;
        write_file(&dir.join(CA_CERT_FILE), &self.ca_pem, false)
    }

    /// Reads the identity of node `name` that [`save`](Self::save) wrote into `dir`, checking that the files
    /// parse and that the certificate names `name`.
    pub fn load(dir: &Path, name: &str) -> Result<NodeIdentity, QuicError> {
        validate_node_name(name)?;
        let identity = NodeIdentity {
            name: name.to_string(),
            cert_pem: read_file(&dir.join(cert_file(name)))?,
            key_pem: read_file(&dir.join(key_file(name)))?,
            ca_pem: read_file(&dir.join(CA_CERT_FILE))?,
        };
        let cert = identity.cert_der()?;
        identity.key_der()?;
        identity.ca_der()?;
        let names = x509::dns_names(&cert)
            .ok_or_else(|| QuicError::Certificate(format!("{}: unreadable certificate", cert_file(name))))?;
        if names.first().map(String::as_str) != Some(name) {
            return Err(QuicError::Certificate(format!(
                "{} names {:?}, not {name:?}",
                cert_file(name),
                names.first().map(String::as_str).unwrap_or("nothing")
            )));
        }
        Ok(identity)
    }

    /// The node's certificate, DER.
    pub(crate) fn cert_der(&self) -> Result<CertificateDer<'static>, QuicError> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| QuicError::Certificate(format!("certificate of node {:?}: {e}", self.name)))
    }

    /// The node's private key, DER.
    pub(crate) fn key_der(&self) -> Result<PrivateKeyDer<'static>, QuicError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| QuicError::Certificate(format!("key of node {:?}: {e}", self.name)))
    }

    /// The CA certificate, DER.
    pub(crate) fn ca_der(&self) -> Result<CertificateDer<'static>, QuicError> {
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map_err(|e| QuicError::Certificate(format!("CA certificate of node {:?}: {e}", self.name)))
    }
}

/// Checks a node name: one or more DNS labels joined by dots, each 1 to 63 characters of lower-case ASCII
/// letters, digits and `-`, not starting or ending with `-`; the last label not all digits (so a name is never
/// read as an IP address); 253 characters at most. "n0", "h200x2-0" and "gpu3.rack1" pass.
///
/// Node names become certificate names and file names, so nothing else is allowed.
pub fn validate_node_name(name: &str) -> Result<(), QuicError> {
    let bad = |why: &str| Err(QuicError::Certificate(format!("node name {name:?} is not a DNS name: {why}")));
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 253 {
        return bad("it is longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return bad("it has an empty label");
        }
        if label.len() > 63 {
            return bad("a label is longer than 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
            return bad("only lower-case letters, digits, '-' and '.' are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label starts or ends with '-'");
        }
    }
    if name.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit())) {
        return bad("its last label is all digits");
    }
    Ok(())
}

fn validate_cluster_name(cluster: &str) -> Result<(), QuicError> {
    if cluster.is_empty() || cluster.chars().count() > MAX_CLUSTER_NAME || cluster.chars().any(char::is_control) {
        return Err(QuicError::Certificate(format!(
            "cluster name {cluster:?} must be 1 to {MAX_CLUSTER_NAME} characters without control characters"
        )));
    }
    Ok(())
}

/// The CA certificate's parameters: the same for a cluster every time, so a CA loaded from PEM signs with
/// exactly the issuer name it was made with.
fn ca_params(cluster: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name.push(DnType::CommonName, cluster);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn certificate_error(what: &'static str) -> impl Fn(rcgen::Error) -> QuicError {
    move |e| QuicError::Certificate(format!("{what}: {e}"))
}

fn cert_file(name: &str) -> String {
    format!("{name}.pem")
}

fn key_file(name: &str) -> String {
    format!("{name}-key.pem")
}

fn read_file(path: &Path) -> Result<String, QuicError> {
    fs::read_to_string(path).map_err(|e| QuicError::Certificate(format!("reading {}: {e}", path.display())))
}

/// Writes `contents` to `path`, replacing it; a secret file gets mode 0600 before anything is written to it.
fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), QuicError> {
    let context = |e: std::io::Error| QuicError::Certificate(format!("writing {}: {e}", path.display()));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(context)?;
    #[cfg(unix)]
    if secret {
        // `mode` only applies to a file this call creates: tighten one that was already there.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(context)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    file.write_all(contents.as_bytes()).map_err(context)?;
    file.sync_all().map_err(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        for good in ["n0", "h200x2-0", "a", "gpu3.rack1", "x1", &"a".repeat(63)] {
            assert!(validate_node_name(good).is_ok(), "{good}");
        }
        for bad in ["", "N0", "n_0", "-n0", "n0-", "n..0", ".n0", "n0.", "0", "n0.42", "1.2.3.4", "n/0", "../x", "n 0"]
        {
            assert!(matches!(validate_node_name(bad), Err(QuicError::Certificate(_))), "{bad}");
        }
        assert!(validate_node_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn cluster_names() {
        assert!(ClusterCa::generate("").is_err());
        assert!(ClusterCa::generate("a\nb").is_err());
        assert!(ClusterCa::generate(&"c".repeat(65)).is_err());
        assert_eq!(ClusterCa::generate("prod cluster").unwrap().cluster(), "prod cluster");
    }

    #[test]
    fn issued_certificate_names_the_node() {
        let ca = ClusterCa::generate("t").unwrap();
        let id = ca.issue("h200x2-0").unwrap();
        assert_eq!(id.name, "h200x2-0");
        assert_eq!(id.ca_pem, ca.cert_pem());
        let der = id.cert_der().unwrap();
        assert_eq!(x509::dns_names(&der).unwrap(), vec!["h200x2-0".to_string()]);
        assert_eq!(x509::common_name(&der).unwrap(), "h200x2-0");
        id.key_der().unwrap();
        assert!(ca.issue("Bad_Name").is_err());
    }

    #[test]
    fn from_pem_round_trip_keeps_the_original_certificate() {
        let ca = ClusterCa::generate("c1").unwrap();
        let loaded = ClusterCa::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(loaded.cluster(), "c1");
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap();
        assert_eq!(x509::subject(loaded.cert.der()), x509::subject(&ca_der));
    }

    #[test]
    fn from_pem_refuses_a_key_of_another_ca() {
        let a = ClusterCa::generate("c1").unwrap();
        let b = ClusterCa::generate("c1").unwrap();
        assert!(matches!(ClusterCa::from_pem(&a.cert_pem(), &b.key_pem()), Err(QuicError::Certificate(_))));
    }

    #[test]
    fn from_pem_refuses_a_certificate_not_made_here() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "c1");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let foreign = params.self_signed(&key).unwrap();
        let err = ClusterCa::from_pem(&foreign.pem(), &key.serialize_pem()).unwrap_err();
        assert!(matches!(err, QuicError::Certificate(ref m) if m.contains("subject")), "{err}");
    }

    #[test]
    fn from_pem_refuses_garbage() {
        let ca = ClusterCa::generate("c1").unwrap();
        assert!(ClusterCa::from_pem("not pem", &ca.key_pem()).is_err());
        assert!(ClusterCa::from_pem(&ca.cert_pem(), "not pem").is_err());
        assert!(ClusterCa::from_pem(&ca.key_pem(), &ca.key_pem()).is_err());
    }

    #[test]
    fn debug_hides_keys() {
        let ca = ClusterCa::generate("c1").unwrap();
        let id = ca.issue("n0").unwrap();
        assert!(!format!("{ca:?}").contains("PRIVATE"));
        assert!(!format!("{id:?}").contains("PRIVATE"));
        assert!(format!("{id:?}").contains("n0"));
    }
}
