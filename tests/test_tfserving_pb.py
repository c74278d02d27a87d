"""The agent's own TF Serving protos (``agent.backends.tfserving_pb``) against upstream's
(tensorflow-serving-api and TensorFlow, the test extra): every package, message, field,
enum value, service and method declared here exists there with the same full name,
number, type, label and oneof, so the bytes interoperate; both sets load in one
process, either first, and messages cross between them intact.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow_serving") is None:
    pytest.skip("needs tensorflow-serving-api (the test extra)", allow_module_level=True)

from google.protobuf import descriptor_pool  # noqa: E402

from agent.backends.tfserving_pb import (POOL, tensorflow_error_pb2,  # noqa: E402
                                         tensorflow_pb2, tensorflow_serving_pb2)

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ("tensorflow_serving.apis.predict_pb2", "tensorflow_serving.apis.get_model_metadata_pb2",
            "tensorflow_serving.apis.get_model_status_pb2",
            "tensorflow_serving.apis.model_management_pb2",
            "tensorflow_serving.apis.model_service_pb2",
            "tensorflow_serving.apis.prediction_service_pb2",
            "tensorflow_serving.config.model_server_config_pb2")


@pytest.fixture(scope="module")
def upstream():
    """protobuf's default pool with tensorflow-serving-api's files (and TensorFlow's)."""
    import importlib

    for name in UPSTREAM:
        importlib.import_module(name)
    return descriptor_pool.Default()


def _messages(d):
    yield d
    for nested in d.nested_types:
        yield from _messages(nested)


def _type(field) -> tuple:
    name = (field.message_type or field.enum_type)
    return (field.type, name.full_name if name else None, field.is_repeated,
            field.containing_oneof.name if field.containing_oneof else None)


def test_every_declaration_is_upstreams(upstream):
    checked = 0
    for module in (tensorflow_error_pb2, tensorflow_pb2, tensorflow_serving_pb2):
        file = module.DESCRIPTOR
        assert file.pool is POOL
        for top in file.message_types_by_name.values():
            for ours in _messages(top):
                theirs = upstream.FindMessageTypeByName(ours.full_name)
                for field in ours.fields:
                    other = theirs.fields_by_name.get(field.name)
                    assert other is not None, f"{ours.full_name}.{field.name} is not upstream's"
                    assert field.number == other.number, f"{ours.full_name}.{field.name}"
                    assert _type(field) == _type(other), f"{ours.full_name}.{field.name}"
                    checked += 1
                for enum in ours.enum_types:
                    _same_enum(enum, upstream.FindEnumTypeByName(enum.full_name))
        for enum in file.enum_types_by_name.values():
            _same_enum(enum, upstream.FindEnumTypeByName(enum.full_name))
        for service in file.services_by_name.values():
            theirs = upstream.FindServiceByName(service.full_name)
            for method in service.methods:
                other = theirs.methods_by_name[method.name]
                assert (method.input_type.full_name, method.output_type.full_name) == \
                    (other.input_type.full_name, other.output_type.full_name)
    assert checked > 50


def _same_enum(ours, theirs) -> None:
    assert {v.name: v.number for v in ours.values} == \
        {v.name: v.number for v in theirs.values}, ours.full_name


def test_messages_cross_both_ways(upstream):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    ours = tensorflow_serving_pb2.PredictRequest()
    ours.model_spec.name = "m"
    ours.model_spec.version.value = 7
    ours.model_spec.signature_name = "serving_default"
    ours.inputs["x"].CopyFrom(tensorflow_pb2.TensorProto(
        dtype=tensorflow_pb2.DT_FLOAT, float_val=[1.5, -2],
        tensor_shape=tensorflow_pb2.TensorShapeProto(
            dim=[tensorflow_pb2.TensorShapeProto.Dim(size=2)])))
    theirs = predict_pb2.PredictRequest.FromString(ours.SerializeToString())
    assert theirs.model_spec.version.value == 7
    np.testing.assert_array_equal(tf.make_ndarray(theirs.inputs["x"]), [1.5, -2])
    theirs.inputs["y"].CopyFrom(tf.make_tensor_proto(np.arange(6, dtype=np.int64).reshape(2, 3)))
    back = tensorflow_serving_pb2.PredictRequest.FromString(theirs.SerializeToString())
    assert back.inputs["y"].dtype == tensorflow_pb2.DT_INT64
    assert [d.size for d in back.inputs["y"].tensor_shape.dim] == [2, 3]
    # maps (inputs) serialize in no fixed order unless asked: compare deterministic forms
    assert (back.SerializeToString(deterministic=True)
            == theirs.SerializeToString(deterministic=True))


@pytest.mark.parametrize("first", [  # upstream first: with the slow tests (CI runs both)
    "ours", pytest.param("upstream", marks=pytest.mark.slow)])
def test_both_load_in_one_process_in_either_order(first):
    ours = "from agent.backends.tfserving_protos import protos; protos()"
    theirs = ("import tensorflow; "
              "from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc")
    steps = [ours, theirs] if first == "ours" else [theirs, ours]
    code = "; ".join(steps) + "; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]
