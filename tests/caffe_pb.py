"""Caffe's Datum and BlobProto messages, defined through protobuf's
descriptor API (no Caffe, no protoc): the oracle that lmdbio.datum is tested
against.  Fields and numbers as Caffe 1.0's caffe.proto (docs/caffe-pytorch.md).

    from caffe_pb import Datum, DatumPacked, DatumExtra, BlobProto
    d = Datum(channels=3, height=2, width=2, data=b"...", label=-1)
    d.SerializeToString()

``DatumPacked`` is Datum with ``float_data [packed = true]`` (a parser must
accept both encodings); ``DatumExtra`` adds fields Caffe does not have, of
every wire type, to test that they are skipped; ``BlobProtoUnpacked``
writes ``data`` unpacked (older writers).
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def _field(msg, name, number, type_, label=F.LABEL_OPTIONAL, packed=None,
           type_name=None, default=None):
    f = msg.field.add(name=name, number=number, type=type_, label=label)
    if packed is not None:
        f.options.packed = packed
    if type_name:
        f.type_name = type_name
    if default is not None:
        f.default_value = default
    return f


def _datum(fdp, name, packed=None, extra=False):
    m = fdp.message_type.add(name=name)
    _field(m, "channels", 1, F.TYPE_INT32)
    _field(m, "height", 2, F.TYPE_INT32)
    _field(m, "width", 3, F.TYPE_INT32)
    _field(m, "data", 4, F.TYPE_BYTES)
    _field(m, "label", 5, F.TYPE_INT32)
    _field(m, "float_data", 6, F.TYPE_FLOAT, F.LABEL_REPEATED, packed=packed)
    _field(m, "encoded", 7, F.TYPE_BOOL, default="false")
    if extra:  # unknown to Caffe: one of each wire type
        _field(m, "x_varint", 8, F.TYPE_INT64)
        _field(m, "x_fixed64", 9, F.TYPE_FIXED64)
        _field(m, "x_bytes", 10, F.TYPE_BYTES)
        _field(m, "x_fixed32", 11, F.TYPE_FIXED32)
        _field(m, "x_sint", 1000, F.TYPE_SINT64)
        _field(m, "x_doubles", 536870911, F.TYPE_DOUBLE, F.LABEL_REPEATED,
               packed=True)
        _field(m, "x_strings", 12, F.TYPE_STRING, F.LABEL_REPEATED)
    return m


def _build():
    fdp = descriptor_pb2.FileDescriptorProto(
        name="lmdbio_tests_caffe.proto", package="caffe", syntax="proto2")
    _datum(fdp, "Datum")
    _datum(fdp, "DatumPacked", packed=True)
    _datum(fdp, "DatumExtra", extra=True)

    shape = fdp.message_type.add(name="BlobShape")
    _field(shape, "dim", 1, F.TYPE_INT64, F.LABEL_REPEATED, packed=True)

    for name, packed in (("BlobProto", True), ("BlobProtoUnpacked", False)):
        b = fdp.message_type.add(name=name)
        _field(b, "shape", 7, F.TYPE_MESSAGE, type_name=".caffe.BlobShape")
        _field(b, "data", 5, F.TYPE_FLOAT, F.LABEL_REPEATED, packed=packed)
        _field(b, "diff", 6, F.TYPE_FLOAT, F.LABEL_REPEATED, packed=packed)
        _field(b, "double_data", 8, F.TYPE_DOUBLE, F.LABEL_REPEATED,
               packed=packed)
        _field(b, "double_diff", 9, F.TYPE_DOUBLE, F.LABEL_REPEATED,
               packed=packed)
        for i, dim in enumerate(("num", "channels", "height", "width")):
            _field(b, dim, i + 1, F.TYPE_INT32, default="0")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)

    def cls(name):
        return message_factory.GetMessageClass(
            pool.FindMessageTypeByName("caffe." + name))

    return {n: cls(n) for n in ("Datum", "DatumPacked", "DatumExtra",
                                 "BlobShape", "BlobProto",
                                 "BlobProtoUnpacked")}


_CLASSES = _build()
Datum = _CLASSES["Datum"]
DatumPacked = _CLASSES["DatumPacked"]
DatumExtra = _CLASSES["DatumExtra"]
BlobShape = _CLASSES["BlobShape"]
BlobProto = _CLASSES["BlobProto"]
BlobProtoUnpacked = _CLASSES["BlobProtoUnpacked"]


def parse_datum(buf):
    """protobuf's reading of buf as a Datum (raises DecodeError)."""
    d = Datum()
    d.ParseFromString(bytes(buf))
    return d
