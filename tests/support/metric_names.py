"""The service's metric names as Prometheus stores them: the one list the alert rules and the exporter are checked against."""

#: The service's metric contract (docs: operations/metrics.md), as the sample
#: names Prometheus stores: a rule naming anything else under perceptron_ has a
#: typo and would never fire. tests/test_metrics.py checks that ServiceMetrics
#: exports exactly these, so this list cannot drift from the code;
#: tests/deploy/test_prometheus_rules.py checks that the rules name no other.
SERVICE_METRICS = {
    "perceptron_events_total",
    "perceptron_mistakes_total",
    "perceptron_updates_total",
    "perceptron_dropped_features_total",
    "perceptron_events_without_known_features_total",
    "perceptron_mixes_total",
    "perceptron_history_records_total",
    "perceptron_poll_loop_turn_seconds_bucket",
    "perceptron_poll_loop_turn_seconds_sum",
    "perceptron_poll_loop_turn_seconds_count",
    "perceptron_history_bytes_total",
    "perceptron_labels_total",
    "perceptron_challenger_mistakes_total",
    "perceptron_challenger_mistake_rate",
    "perceptron_drift_detected_total",
    "perceptron_last_drift_timestamp_seconds",
    "perceptron_pending_labels",
    "perceptron_early_labels",
    "perceptron_label_delay_seconds_bucket",
    "perceptron_label_delay_seconds_sum",
    "perceptron_label_delay_seconds_count",
    "perceptron_mix_records_rejected_total",
    "perceptron_rejected_events_total",
    "perceptron_rejected_state_total",
    "perceptron_mistake_rate",
    "perceptron_mistake_rate_window_events",
    "perceptron_processing_latency_seconds_bucket",
    "perceptron_processing_latency_seconds_sum",
    "perceptron_processing_latency_seconds_count",
    "perceptron_consumer_lag",
    "perceptron_weight_norm",
    "perceptron_data_radius",
    "perceptron_last_checkpoint_timestamp_seconds",
    "perceptron_transactions_total",
    "perceptron_transaction_commit_seconds_bucket",
    "perceptron_transaction_commit_seconds_sum",
    "perceptron_transaction_commit_seconds_count",
    "perceptron_poll_loop_last_turn_timestamp_seconds",
    "perceptron_assigned_partitions",
    "perceptron_build_info",
}
