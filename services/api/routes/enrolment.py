"""Node enrolment: a node is registered in its cluster and handed its report key.

The collector takes reports only from enrolled nodes, each authenticated by the key derived
for it from the report master (common/reportauth.py). Two callers may enrol:
- an admin, any node, again if need be (`warden nodes enroll`): a re-enrolment hands out the
  same key, for an agent that lost its own;
- a node's bootstrap token (role `node`, which can do nothing else): only a node whose key
  was never handed out, registered before (`warden cluster register NODE...`) or not. The
  set of handed-out keys' add is the check, so of two agents racing for one name, one wins.
  A bootstrap token that could hand out a key again would give its holder the key of any
  running node, and with it that node's voice: the forged-report attack this key stops.
Every enrolment and every refusal is audited.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from common.reportauth import enrol_key, ensure_master, master_path
from schemas.envelope import Identifier
from services.api.auth import Principal, Role
from services.api.deps import RuntimeDep, audit, client_detail, require
from services.shared.registry import register_nodes

router = APIRouter(prefix="/nodes", tags=["nodes"])

Enroller = Annotated[Principal, Depends(require("node"))]
ENROLLERS: frozenset[Role] = frozenset({"node", "admin"})


class EnrolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cluster_id: Identifier
    node_id: Identifier


class ReportKeyOut(BaseModel):
    kid: str = Field(description="The report master's key id the key was derived under.")
    cluster_id: str
    node_id: str
    key: str = Field(description="The node's secret, base64url: the agent's report key file "
                                 "holds this object as it is (AGENT_REPORT_KEY_FILE).")


class EnrolOut(BaseModel):
    cluster_id: str
    node_id: str
    new: bool = Field(description="False: the node's key was handed out before (an admin's "
                                  "re-enrolment).")
    report_key: ReportKeyOut


@router.post("/enroll", response_model=EnrolOut,
             summary="Enrol a node and hand out its report key (admin, or a bootstrap token "
                     "for a node not enrolled yet; audited)")
async def enroll(body: EnrolRequest, request: Request, rt: RuntimeDep,
                 who: Enroller) -> EnrolOut:
    target = f"node/{body.cluster_id}/{body.node_id}"
    detail = client_detail(request)
    # Not a rank: a viewer or an operator ranks above a bootstrap token, and enrols nothing.
    if who.role not in ENROLLERS:
        await audit(rt, who, "authorize", request.url.path,
                    f"enrolment needs a bootstrap token or the admin role, has {who.role}",
                    "403", detail)
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"enrolment needs a bootstrap token or the admin role; {who.user} "
                            f"is {who.role}")
    new = bool(await rt.redis.sadd(rt.keys.keys_handed(body.cluster_id), body.node_id))
    if not new and not who.allows("admin"):
        await audit(rt, who, "node_enroll", target, "a bootstrap token re-enrolling a node",
                    "409 key handed out already", detail)
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"the key of {body.cluster_id}/{body.node_id} was handed out "
                            "already; an admin enrols it again (warden nodes enroll)")
    # The master the collector checks reports with: the same file (WARDEN_REPORT_MASTER_KEY),
    # or the state folder's, made by whichever of the two comes first.
    await register_nodes(rt.redis, rt.keys, body.cluster_id, [body.node_id])
    master = ensure_master(master_path(rt.settings.report_master_key, rt.settings.state_dir))
    key = enrol_key(master, body.cluster_id, body.node_id)
    await audit(rt, who, "node_enroll", target, "enrolled" if new else "re-enrolled",
                "200", detail | {"kid": key.kid})
    return EnrolOut(cluster_id=body.cluster_id, node_id=body.node_id, new=new,
                    report_key=ReportKeyOut.model_validate(json.loads(key.to_json())))
