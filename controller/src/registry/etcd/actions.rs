//! Operators' drains and silences in etcd: `actions/<id, 20 digits>` -> the prost body.
//! Every replica reads them back (`ControllerState::refresh_actions`), so a drain taken on
//! one replica holds on all, and on the next leader.

use prost::Message;
use rpingmesh_proto::operator::Action;

use super::{etcd_err, EtcdRegistry, RegistryError};

pub(super) const ACTIONS: &str = "/rpingmesh/actions/";

fn key(id: u64) -> String {
    format!("{ACTIONS}{id:020}")
}

impl EtcdRegistry {
    pub(super) fn put_action(&self, a: &Action) -> Result<(), RegistryError> {
        let (k, v) = (key(a.id), a.encode_to_vec());
        self.call("save action", move |mut c| async move {
            c.put(k, v, None).await.map_err(etcd_err)?;
            Ok(())
        })
    }

    pub(super) fn remove_action(&self, id: u64) -> Result<(), RegistryError> {
        let k = key(id);
        self.call("delete action", move |mut c| async move {
            c.delete(k, None).await.map_err(etcd_err)?;
            Ok(())
        })
    }
}
