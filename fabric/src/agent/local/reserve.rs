//! A local client's reservations: memory of one of the node's devices set aside by the node's fabric for the
//! client, named by ids of its own connection (a client draws only on its own), and given back when it says so
//! or when its connection ends.

use vfabric_allocator::{Location, TenantId};

use super::session::Session;
use crate::agent::shared::{in_place, Agent};
use crate::directory::DirectoryError;
use crate::error::FabricError;
use crate::proto::message::Message;

impl Agent {
    /// `Reserve`: the node's fabric sets the memory aside now (evicting as an acquire would), or refuses at once.
    pub(super) fn reserve_for(
        &self,
        session: &mut Session,
        device: Location,
        bytes: u64,
        tenant: u32,
    ) -> Result<Message, FabricError> {
        let fabric = self.fabric();
        let reservation = in_place(|| fabric.reserve(device, bytes, TenantId(tenant)))?;
        let held = reservation.bytes()?;
        session.next_reservation += 1;
        let id = session.next_reservation;
        session.reservations.insert(id, reservation);
        Ok(Message::Reserved { id, bytes: held })
    }

    /// `Unreserve`: one of the client's reservations goes, and what it still held with it.
    pub(super) fn unreserve_for(&self, session: &mut Session, id: u64) -> Result<Message, FabricError> {
        session.reservations.remove(&id).ok_or(DirectoryError::UnknownReservation(id))?;
        Ok(Message::Done)
    }

    /// `ReservationLeft`: what one of the client's reservations still holds.
    pub(super) fn reservation_left(&self, session: &Session, id: u64) -> Result<Message, FabricError> {
        let r = session.reservations.get(&id).ok_or(DirectoryError::UnknownReservation(id))?;
        Ok(Message::Reserved { id, bytes: r.bytes()? })
    }
}

impl Session {
    /// The fabric's id of one of the client's reservations, for a placement to name.
    pub(super) fn reservation(&self, id: u64) -> Result<u64, FabricError> {
        Ok(self.reservations.get(&id).ok_or(DirectoryError::UnknownReservation(id))?.id())
    }
}
