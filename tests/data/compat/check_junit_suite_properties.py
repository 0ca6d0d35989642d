def test_records_suite_and_xml(record_testsuite_property, record_xml_attribute):
    record_testsuite_property("build", "compat-42")
    record_xml_attribute("owner", "compat-team")
