"""What is printed and written: the header, the tables, the JSON report and its schema, plots, TensorBoard;
every file atomically. It formats what was measured and decided, and decides nothing."""
