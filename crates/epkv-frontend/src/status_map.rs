//! The one mapping from engine outcomes to wire status codes.

use epkv_engine_api::EngineStatus;
use epkv_protocol::{Opcode, Status};

/// Maps an engine outcome to the status sent to the client.
///
/// This is the only place the mapping lives, and it is an exhaustive `match` with no
/// wildcard: a new [`EngineStatus`] variant does not compile until it is mapped here
/// (kv_engine's `engine_errc_2_mcbp`, made total).
///
/// This is the code a client that agreed to XERROR gets; [`status_for_client`] remaps it
/// for the others. [`EngineStatus::UnknownStatGroup`] → 0x01 `KeyEnoent`, as kv_engine
/// answers STAT with a group it does not know.
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
        EngineStatus::UnknownCollection => Status::UnknownCollection,
        EngineStatus::UnknownScope => Status::UnknownScope,
        EngineStatus::OutOfRange => Status::Erange,
        EngineStatus::Internal => Status::Einternal,
        EngineStatus::TooBusy => Status::Ebusy,
        EngineStatus::VbUuidNotEqual => Status::VbUuidNotEqual,
        EngineStatus::RangeScanCancelled => Status::RangeScanCancelled,
        // The session waits for the fetch and re-executes instead of answering; should an
        // outcome ever reach a client, "retry" is what it means.
        EngineStatus::WouldBlock => Status::Etmpfail,
    }
}

/// The status a client is sent for a wire status produced by the engine (through
/// [`engine_status_to_wire`]) or by the front end's own checks (0x08 NoBucket), or `None`
/// when the connection must be closed instead (kv_engine `Connection::remapErrorCode`).
///
/// A client that agreed to XERROR (HELLO 0x07) understands every status in the error map
/// and gets [`engine_status_to_wire`]'s code. The others are classic clients that know
/// only the memcached codes and NOT_MY_VBUCKET:
/// - `Locked` → 0x02 `KeyEexists` for writes; for GET_LOCKED and UNLOCK_KEY (kv_engine's
///   `locked_tmpfail`) → 0x86 `Etmpfail`;
/// - `NotLocked` and `SyncWriteInProgress` → 0x86 `Etmpfail` (retry later);
/// - `NoBucket`, `Eaccess` and the durability outcomes (`DurabilityInvalidLevel`,
///   `DurabilityImpossible`, `SyncWriteAmbiguous`) and the range scan outcomes
///   (`VbUuidNotEqual`, `RangeScanCancelled`) have no classic equivalent: the connection
///   is closed, as kv_engine does.
#[must_use]
pub fn status_for_client(wire: Status, opcode: u8, xerror: bool) -> Option<Status> {
    if xerror {
        return Some(wire);
    }
    let lock_op = matches!(
        Opcode::from_u8(opcode),
        Some(Opcode::GetLocked | Opcode::UnlockKey)
    );
    match wire {
        Status::Locked if lock_op => Some(Status::Etmpfail),
        Status::Locked => Some(Status::KeyEexists),
        Status::NotLocked | Status::SyncWriteInProgress => Some(Status::Etmpfail),
        Status::NoBucket
        | Status::Eaccess
        | Status::DurabilityInvalidLevel
        | Status::DurabilityImpossible
        | Status::SyncWriteAmbiguous
        | Status::VbUuidNotEqual
        | Status::RangeScanCancelled => None,
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_clients_get_classic_codes_or_are_disconnected() {
        let w = engine_status_to_wire;
        let set = Opcode::Set.as_u8();
        let getl = Opcode::GetLocked.as_u8();
        let unl = Opcode::UnlockKey.as_u8();
        assert_eq!(
            status_for_client(w(EngineStatus::Locked), set, true),
            Some(Status::Locked)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::Locked), set, false),
            Some(Status::KeyEexists)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::Locked), getl, false),
            Some(Status::Etmpfail)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::Locked), unl, false),
            Some(Status::Etmpfail)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::NotLocked), unl, false),
            Some(Status::Etmpfail)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::NotLocked), unl, true),
            Some(Status::NotLocked)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::SyncWriteInProgress), set, false),
            Some(Status::Etmpfail)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::DurabilityImpossible), set, false),
            None
        );
        assert_eq!(status_for_client(Status::NoBucket, set, false), None);
        assert_eq!(
            status_for_client(Status::NoBucket, set, true),
            Some(Status::NoBucket)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::KeyNotFound), set, false),
            Some(Status::KeyEnoent)
        );
        assert_eq!(
            status_for_client(w(EngineStatus::NotMyVbucket), set, false),
            Some(Status::NotMyVbucket)
        );
    }

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
        assert_eq!(engine_status_to_wire(EngineStatus::TooBusy).as_u16(), 0x85);
        assert_eq!(
            engine_status_to_wire(EngineStatus::RangeScanCancelled).as_u16(),
            0xa5
        );
        assert_eq!(
            engine_status_to_wire(EngineStatus::VbUuidNotEqual).as_u16(),
            0xa8
        );
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
