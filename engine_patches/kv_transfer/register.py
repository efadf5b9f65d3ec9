"""Make ``--disaggregation-transfer-backend tcp`` a backend SGLang knows.

SGLang's backend list is closed in three places; each is widened here, narrowly:
1. the CLI choices (``arg_groups.choices.add_disagg_transfer_backend_choices``, public);
2. the ``TransferBackend`` enum (a member ``TCP = "tcp"`` is added);
3. ``disaggregation.utils.get_kv_class`` (an AROUND hook answers for ``tcp`` and
   defers to SGLang for every other backend).
``tests/engine_patches/test_kv_transfer_registration.py`` checks all three, so an
SGLang upgrade that moves them fails loudly.
"""

from __future__ import annotations

BACKEND = "tcp"
GET_KV_CLASS = "sglang.srt.disaggregation.utils.get_kv_class"


def _extend_enum(enum_cls, name: str, value: str):
    if value in enum_cls._value2member_map_:
        return enum_cls._value2member_map_[value]
    member = object.__new__(enum_cls)
    member._name_, member._value_ = name, value
    type.__setattr__(enum_cls, name, member)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    enum_cls._member_names_.append(name)
    return member


def tcp_classes() -> dict:
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.utils import KVClassType

    from engine_patches.kv_transfer.manager import TcpKVBootstrapServer, TcpKVManager
    from engine_patches.kv_transfer.receiver import TcpKVReceiver
    from engine_patches.kv_transfer.sender import TcpKVSender

    return {
        KVClassType.KVARGS: KVArgs,
        KVClassType.MANAGER: TcpKVManager,
        KVClassType.SENDER: TcpKVSender,
        KVClassType.RECEIVER: TcpKVReceiver,
        KVClassType.BOOTSTRAP_SERVER: TcpKVBootstrapServer,
    }


def _get_kv_class_around(original, transfer_backend, class_type):
    if getattr(transfer_backend, "value", transfer_backend) == BACKEND:
        return tcp_classes()[class_type]
    return original(transfer_backend, class_type)


def register() -> None:
    from sglang.srt.arg_groups.choices import (
        DISAGG_TRANSFER_BACKEND_CHOICES,
        add_disagg_transfer_backend_choices,
    )
    from sglang.srt.disaggregation.utils import TransferBackend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    _extend_enum(TransferBackend, "TCP", BACKEND)
    HookRegistry.register(GET_KV_CLASS, _get_kv_class_around, HookType.AROUND)
