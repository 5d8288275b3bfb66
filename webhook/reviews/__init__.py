"""AdmissionReview on the wire (`admission.k8s.io/v1`): the decoded request, and responses."""
