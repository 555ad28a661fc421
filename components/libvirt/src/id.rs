//! Provider IDs: `<connection>/<domain name>`. The name, not the UUID, so that a delete cut after
//! the domain's undefine still finds the volumes named after it.

/// The provider ID of domain `name` on connection `connection`.
pub fn format(connection: &str, name: &str) -> String {
    format!("{connection}/{name}")
}

/// `(connection, name)` of a provider ID; why not for anything else (each operation chooses the
/// class: `get` answers `not-found`, `delete` `permanent`, as docs/contract.md has it).
pub fn parse(id: &str) -> Result<(&str, &str), String> {
    match id.split_once('/') {
        Some((connection, name))
            if !connection.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((connection, name))
        }
        _ => Err(format!("provider ID {id:?} is not <connection>/<domain>")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_bad_ones_are_refused() {
        assert_eq!(
            parse(&format("hv1", "proxy-a")).unwrap(),
            ("hv1", "proxy-a")
        );
        for bad in ["", "hv1", "/a", "hv1/", "hv1/a/b"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
