"""The metrics profile's dashboard, written as code (dashboard: `sparkserve dashboard`)."""
