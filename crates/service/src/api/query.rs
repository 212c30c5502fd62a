//! Query parameters as the contract wants them read: only the operation's
//! own, each at most once, an empty value the same as an absent one.

use super::ApiError;

/// The values of `names` in `query`, in that order; a parameter that is not
/// one of them, or is repeated, is a `400` naming it.
pub(super) fn parameters<const N: usize>(
    query: Option<&str>,
    names: [&'static str; N],
) -> Result<[Option<String>; N], ApiError> {
    let mut values: [Option<String>; N] = std::array::from_fn(|_| None);
    let mut seen = [false; N];
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let Some(index) = names.iter().position(|known| *known == name) else {
            let shown: String = name.chars().take(64).collect();
            let allowed = if names.is_empty() {
                "This operation takes none.".to_owned()
            } else {
                format!("Allowed: {}.", names.join(", "))
            };
            return Err(ApiError::invalid_param(
                shown.clone(),
                format!("Unknown query parameter `{shown}`. {allowed}"),
            ));
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(ApiError::invalid(names[index], format!("`{name}` may be given only once.")));
        }
        if !value.is_empty() {
            values[index] = Some(value.into_owned());
        }
    }
    Ok(values)
}

/// No parameter at all: any is a `400` naming it.
pub(super) fn no_query(query: Option<&str>) -> Result<(), ApiError> {
    parameters(query, [] as [&str; 0]).map(|_| ())
}

/// The `limit` parameter: `default` when absent, else a whole number from 1
/// to `max`.
pub(super) fn page_size(value: Option<String>, default: u32, max: u32) -> Result<u32, ApiError> {
    let Some(text) = value else {
        return Ok(default);
    };
    whole_number(&text)
        .filter(|limit| (1..=u64::from(max)).contains(limit))
        .map(|limit| limit as u32)
        .ok_or_else(|| ApiError::invalid("limit", format!("`limit` must be a whole number from 1 to {max}.")))
}

/// A base-10 number of digits only (no sign, no spaces), that fits.
pub(super) fn whole_number(text: &str) -> Option<u64> {
    text.bytes().all(|b| b.is_ascii_digit()).then(|| text.parse().ok()).flatten()
}
