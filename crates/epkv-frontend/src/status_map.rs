//! The one mapping from engine outcomes to wire status codes.

use epkv_engine_api::EngineStatus;
use epkv_protocol::Status;

/// Maps an engine outcome to the status sent to the client.
///
/// This is the only place the mapping lives, and it is an exhaustive `match` with no
/// wildcard: a new [`EngineStatus`] variant does not compile until it is mapped here
/// (kv_engine's `engine_errc_2_mcbp`, made total).
///
/// Choices where kv_engine depends on negotiation:
/// - [`EngineStatus::Locked`] → 0x09 `Locked` and [`EngineStatus::NotLocked`] → 0x0e
///   `NotLocked`, the codes kv_engine sends to clients that agreed to XERROR. kv_engine
///   remaps them for clients without XERROR (locked writes → 0x02, GET_LOCKED on a
///   locked key and UNLOCK of an unlocked key → 0x86). epkv does not implement XERROR yet
///   and sends the precise codes to everyone, because they are what the lock semantics
///   are specified by (memcached binary clients treat any unknown non-zero status as a
///   failure, which is what the remapped codes mean to them too).
/// - [`EngineStatus::UnknownStatGroup`] → 0x01 `KeyEnoent`, as kv_engine answers STAT
///   with a group it does not know.
#[must_use]
pub fn engine_status_to_wire(status: EngineStatus) -> Status {
    match status {
        EngineStatus::KeyNotFound => Status::KeyEnoent,
        EngineStatus::KeyExists => Status::KeyEexists,
        EngineStatus::NotStored => Status::NotStored,
        EngineStatus::TooBig => Status::E2big,
        EngineStatus::Invalid => Status::Einval,
        EngineStatus::DeltaBadValue => Status::DeltaBadval,
        EngineStatus::NotMyVbucket => Status::NotMyVbucket,
        EngineStatus::Locked => Status::Locked,
        EngineStatus::NotLocked => Status::NotLocked,
        EngineStatus::TempFail => Status::Etmpfail,
        EngineStatus::NoMemory => Status::Enomem,
        EngineStatus::NotSupported => Status::NotSupported,
        EngineStatus::DurabilityInvalidLevel => Status::DurabilityInvalidLevel,
        EngineStatus::DurabilityImpossible => Status::DurabilityImpossible,
        EngineStatus::SyncWriteInProgress => Status::SyncWriteInProgress,
        EngineStatus::SyncWriteAmbiguous => Status::SyncWriteAmbiguous,
        EngineStatus::UnknownStatGroup => Status::KeyEnoent,
        EngineStatus::Internal => Status::Einternal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_map_to_memcached_codes() {
        assert_eq!(
            engine_status_to_wire(EngineStatus::KeyNotFound).as_u16(),
            0x01
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::KeyExists).as_u16(),
            0x02
        );
        assert_eq!(engine_status_to_wire(EngineStatus::TooBig).as_u16(), 0x03);
        assert_eq!(
            engine_status_to_wire(EngineStatus::NotStored).as_u16(),
            0x05
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::DeltaBadValue).as_u16(),
            0x06
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::NotMyVbucket).as_u16(),
            0x07
        );
        assert_eq!(engine_status_to_wire(EngineStatus::Locked).as_u16(), 0x09);
        assert_eq!(engine_status_to_wire(EngineStatus::TempFail).as_u16(), 0x86);
        assert_eq!(
            engine_status_to_wire(EngineStatus::NotSupported).as_u16(),
            0x83
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::UnknownStatGroup).as_u16(),
            0x01
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::DurabilityInvalidLevel).as_u16(),
            0xa0
        );
    }
}
