//! The names configuration files use for the config-ish types, checked through serde's
//! in-memory deserializers (no format crate needed).

use serde::de::value::{Error, StrDeserializer, U32Deserializer, U64Deserializer};
use serde::de::IntoDeserializer;
use serde::Deserialize;
use vfabric_allocator::{Fit, PageSize, TenantId, Tier};

fn from_str<'de, T: Deserialize<'de>>(s: &'de str) -> Result<T, Error> {
    let de: StrDeserializer<'de, Error> = s.into_deserializer();
    T::deserialize(de)
}

#[test]
fn fit_names_are_kebab_case() {
    assert_eq!(from_str::<Fit>("first-fit").unwrap(), Fit::FirstFit);
    assert_eq!(from_str::<Fit>("best-fit").unwrap(), Fit::BestFit);
    assert!(from_str::<Fit>("FirstFit").is_err());
    assert_eq!(Fit::FirstFit.to_string(), "first-fit");
    assert_eq!(Fit::BestFit.to_string(), "best-fit");
    assert_eq!(Fit::default(), Fit::FirstFit);
}

#[test]
fn tier_names_are_lowercase() {
    assert_eq!(from_str::<Tier>("gpu").unwrap(), Tier::Gpu);
    assert_eq!(from_str::<Tier>("host").unwrap(), Tier::Host);
    assert_eq!(from_str::<Tier>("nvme").unwrap(), Tier::Nvme);
    assert!(from_str::<Tier>("Gpu").is_err());
}

#[test]
fn page_size_is_validated_bytes() {
    let de: U64Deserializer<Error> = (64u64 * 1024).into_deserializer();
    assert_eq!(PageSize::deserialize(de).unwrap(), PageSize::KIB_64);
    let de: U64Deserializer<Error> = 4096u64.into_deserializer();
    let err = PageSize::deserialize(de).unwrap_err().to_string();
    assert!(err.contains("invalid page size 4096"), "{err}");
}

#[test]
fn tenant_id_is_a_plain_number() {
    let de: U32Deserializer<Error> = 7u32.into_deserializer();
    assert_eq!(TenantId::deserialize(de).unwrap(), TenantId(7));
}
