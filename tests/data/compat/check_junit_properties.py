def test_records_a_property(record_property):
    record_property("gpu_kind", "h200")
    record_property("batch_size", 8)
