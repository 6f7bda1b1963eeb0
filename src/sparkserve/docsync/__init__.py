"""The docs' generated tables: the data files under docs/data written out where people read
them (data_tables, `sparkserve docs sync`)."""
