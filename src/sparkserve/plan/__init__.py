"""`sparkserve plan` and `sparkserve recipes`: what a start would use of a Spark's memory, for
one node (single) or a pair (pair), and each recipe's plan (recipe_summary, recipes_cli),
predicted from the settings and the checkpoint before anything is downloaded."""
