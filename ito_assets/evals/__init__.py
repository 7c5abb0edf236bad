"""The eval suite the data is decontaminated against and the gates are measured on."""
